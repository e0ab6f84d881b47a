"""The example job (`ddctl up --dry-run` on regions.yaml) to its end, at each of several settings of one knob.

    .venv/bin/python docs/measure_main_job.py [--knob max_behind] [--values 1,0] [--pairs 3] [--out FILE]

Each repeat runs the example once per value, in the order given, as a run of its own (regions.yaml with the run
renamed and ``training.<knob>: value``, in a ``DDCTL_HOME`` of its own), waits for `ddctl status --json` to say the
job finished, and prints the summary's val_bpb, goodput (beside what the learners' own exit summaries give), rounds and
token books; `--out` keeps every run as JSON. The runs alternate, so a machine that gets busier costs each value alike.
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

ROOT = Path(__file__).resolve().parent.parent
DDCTL = str(ROOT / ".venv" / "bin" / "ddctl")


def run_once(knob: str, value: Any, name: str, deadline_s: float) -> dict[str, Any]:
    """One run of the example with ``training.<knob>: value``; its finished summary."""
    home = Path(tempfile.mkdtemp(prefix=f"ddctl-{name}-"))
    spec = yaml.safe_load((ROOT / "regions.yaml").read_text())
    spec["run"], spec["training"][knob] = name, value
    (home / "regions.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, "DDCTL_HOME": str(home / "home")}
    started = time.monotonic()
    subprocess.run([DDCTL, "up", "--dry-run", "-f", str(home / "regions.yaml"), "--json"], env=env, check=True,
                   capture_output=True, cwd=ROOT)  # fmt: skip
    while time.monotonic() - started < deadline_s:
        status = subprocess.run([DDCTL, "status", "--run", name, "--json"], env=env, capture_output=True, text=True)
        job = json.loads(status.stdout or "{}").get("job") or {}
        if job.get("phase") == "finished":
            summary = job["summary"]
            learners = sum(int(region.get("learners", 0)) for region in spec["regions"])
            said = learners_say(home / "home" / "runs" / name / "logs", learners, summary["uptime_s"])
            return {"run": name, knob: value, "seconds": round(time.monotonic() - started, 1), **summary, "learners_say": said}
        time.sleep(5)
    subprocess.run([DDCTL, "down", "--run", name], env=env, capture_output=True)
    raise TimeoutError(f"{name} did not finish in {deadline_s:.0f} s")


def learners_say(logs: Path, learners: int, uptime_s: float) -> float | None:
    """The goodput the learners' own exit summaries give (``train_seconds``, in the logs the controller collects as
    each learner retires): what the summary's goodput claims to measure. None if a log is not home within 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seconds = []
        for log in sorted(logs.glob("L*.log")):
            lines = [line for line in log.read_text().splitlines() if line.startswith("{") and '"train_seconds"' in line]
            if lines:
                seconds.append(float(json.loads(lines[-1])["train_seconds"]))
        if len(seconds) == learners:
            return round(sum(seconds) / (learners * uptime_s), 4)
        time.sleep(2)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--knob", default="max_behind")
    parser.add_argument("--values", default="1,0", help="comma-separated, each read as YAML")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds a run may take")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    values = [yaml.safe_load(v) for v in args.values.split(",")]
    runs = []
    for i in range(args.pairs):
        for value in values:
            row = run_once(args.knob, value, f"m{i + 1}-{args.knob.replace('_', '')}{value}", args.deadline)
            tokens = row["tokens"]
            books = f"merged {tokens['merged']}, late-merged {tokens['late_merged']}, dropped {tokens['dropped']}"
            said = (
                f"val_bpb {row['val_bpb']}, goodput {row['goodput']} (learners say {row['learners_say']}), rounds {row['rounds']}"
            )
            print(f"{row['run']}: {said}, {books}, {row['seconds']} s", flush=True)
            runs.append(row)
    for value in values:
        mine = [r["val_bpb"] for r in runs if r[args.knob] == value]
        print(f"{args.knob} = {value}: val_bpb mean {sum(mine) / len(mine):.4f}, range {min(mine)}-{max(mine)}")
    if args.out:
        command = " ".join(["docs/measure_main_job.py", *sys.argv[1:]])
        args.out.write_text(json.dumps({"command": command, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
