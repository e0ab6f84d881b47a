"""``ddctl up --dry-run`` with one synchronizer against the same job with a sharded one, in the same run.

Each configuration is a real ``up`` of process regions (two regions, a learner
each, the tiny preset) to the job's end: the controller records the result, then
``ddctl replay --run`` replays the run's tapes. Printed per run: seconds to the
first merged round, seconds from ``up`` to the recorded result, rounds, val_bpb,
bytes both ways, whether the replay gave the recorded model bit for bit, and for
the sharded run the seconds between the last shard's end and its joined model on
disk (the controller's global checkpoint of the shards and its evaluation). Run from the repository:

    .venv/bin/python docs/measure_up_sharded.py [--tokens 300000] [--repeats 2] [--link-mbps 0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

DDCTL = str(Path(sys.executable).with_name("ddctl"))


def ddctl(home: Path, *args: str, timeout: float = 900) -> dict[str, Any]:
    done = subprocess.run([DDCTL, *args, "--json"], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "DDCTL_HOME": str(home)})  # fmt: skip
    if done.returncode not in (0, 4):
        raise SystemExit(f"ddctl {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout))


def run_to_its_end(home: Path, run: str, started: float, limit_s: float = 900) -> float:
    """Seconds from ``started`` until ``ddctl ls`` says ``run`` finished (an error past ``limit_s``)."""
    while next(r for r in ddctl(home, "ls")["runs"] if r["run"] == run)["state"] != "finished":
        if time.monotonic() - started > limit_s:
            raise SystemExit(f"{run} did not finish in {limit_s:g} s")
        time.sleep(1.0)
    return time.monotonic() - started


def one(shards: int, tokens: int, link_mbps: float, root: Path) -> dict[str, Any]:
    home, run = root / f"home-{shards}", f"m{shards}"
    link = {"link": {"up_mbps": link_mbps, "down_mbps": link_mbps}} if link_mbps else {}
    region = {"provider": "process", "learners": 1, **link}
    raw = {"run": run, "training": {"preset": "tiny", "tokens": tokens, "fragments": 4, "inner_steps": 8},
           "regions": [{"name": "east", **region}, {"name": "west", **region}]}  # fmt: skip
    raw |= {"synchronizer": {"shards": shards}} if shards > 1 else {"syncer": "east"}
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"regions-{shards}.yaml"
    path.write_text(yaml.safe_dump(raw))
    started = time.monotonic()
    up = ddctl(home, "up", "-f", str(path), "--dry-run")
    try:
        ended = run_to_its_end(home, run, started)
        summary = ddctl(home, "status", "--run", run)["job"]["summary"]
        replay = ddctl(home, "replay", "--run", run, timeout=1800)
    finally:
        ddctl(home, "down", "--run", run)
    states = sorted((home / "runs" / run / "job").glob("state*/summary.json"))
    last_shard_end = max(json.loads(p.read_text())["finished_at"] for p in states)
    final = home / "runs" / run / "final" / "manifest.json"  # written once the controller joined the shards' model
    return {
        "shards": shards,
        "first_round_s": up["seconds_to_first_round"],
        "run_s": round(ended, 1),
        "rounds": summary["rounds"],
        "val_bpb": summary["val_bpb"],
        "bytes": summary["bytes_up"] + summary["bytes_down"],
        "merged_tokens": summary["tokens"]["merged"] + summary["tokens"]["late_merged"],
        "join_s": round(final.stat().st_mtime - last_shard_end, 2) if final.is_file() else None,
        "replay_match": replay["match"],
        "replay_val_bpb": replay["val_bpb"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--link-mbps", type=float, default=0.0, help="shape each region's link (needs root and tc)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for shards in (1, 2):  # interleaved: the machine's noise falls on both alike
                row = one(shards, args.tokens, args.link_mbps, Path(tmp) / f"r{repeat}")
                rows.append(row)
                print(json.dumps(row), flush=True)
    for repeat in range(args.repeats):
        single, sharded = rows[2 * repeat], rows[2 * repeat + 1]
        ratio = sharded["run_s"] / single["run_s"]
        print(f"repeat {repeat}: sharded / single run time {ratio:.2f}, rounds {sharded['rounds']} vs {single['rounds']}, "
              f"val_bpb {sharded['val_bpb']} vs {single['val_bpb']}")  # fmt: skip


if __name__ == "__main__":
    main()
