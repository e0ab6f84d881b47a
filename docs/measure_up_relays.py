"""``ddctl up --dry-run`` with the plan's relays against the same job without them, one after the other.

Each configuration is a real ``up`` of process regions to the job's end (the tiny
preset): east with one learner and the synchronizer, west with ``--west``
learners behind one shaped link (a namespace per region: its learners share it,
which is the site a relay saves). With relays, west's first learner hosts the
relay. What crossed west's link from the synchronizer is the synchronizer's bytes
sent less what east's learner read (its summary); what west's learners read is
their summaries' sum. Printed per configuration: those two, their ratio, the
bytes crossing west's link per token west trained, seconds from ``up`` to the
recorded result, rounds and val_bpb. Run from the repository (as root, for the
shaped links):

    .venv/bin/python docs/measure_up_relays.py [--tokens 1500000] [--west 3] [--link-mbps 20]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from measure_up_sharded import ddctl, run_to_its_end  # docs/, beside this script


def one(relays: bool, tokens: int, west: int, link_mbps: float, root: Path) -> dict[str, Any]:
    home, run = root / f"home-{relays}", f"relays-{'on' if relays else 'off'}"
    link = {"link": {"up_mbps": link_mbps, "down_mbps": link_mbps}}
    raw = {
        "run": run,
        "training": {"preset": "tiny", "tokens": tokens, "fragments": 4, "inner_steps": 8},
        "synchronizer": {"shards": 1, "regions": ["east"], "relays": relays},
        "regions": [
            {"name": "east", "provider": "process", "learners": 1, "link": {"up_mbps": 1000, "down_mbps": 1000}},
            {"name": "west", "provider": "process", "learners": west, **link},
        ],
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"regions-{relays}.yaml"
    path.write_text(yaml.safe_dump(raw))
    plan = ddctl(home, "up", "-f", str(path), "--dry-run", "--plan")
    hosts = [i["name"] for i in plan["instances"] if i["relay"] == "host"]
    started = time.monotonic()
    ddctl(home, "up", "-f", str(path), "--dry-run")
    try:
        ended = run_to_its_end(home, run, started)
        summary = ddctl(home, "status", "--run", run)["job"]["summary"]
    finally:
        ddctl(home, "down", "--run", run)
    read = {p.stem: json.loads(p.read_text()) for p in (home / "runs" / run / "summaries").glob("L*.json")}
    crossed = summary["bytes_down"] - read["L0"]["bytes_down"]  # L0 is east's learner
    west_read = sum(s["bytes_down"] for name, s in read.items() if name != "L0")
    west_tokens = sum(s["trained_tokens"] for name, s in read.items() if name != "L0")
    return {
        "relays": relays,
        "relay_hosts": hosts,
        "west_link_bytes": crossed,
        "west_learners_read": west_read,
        "read_per_crossed": round(west_read / crossed, 3) if crossed else None,
        "west_link_bytes_per_token": round(crossed / west_tokens, 3) if west_tokens else None,
        "learners": {name: [s.get("reason"), s["bytes_down"], s["trained_tokens"]] for name, s in sorted(read.items())},
        "run_s": round(ended, 1),
        "rounds": summary["rounds"],
        "val_bpb": summary["val_bpb"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1_500_000)
    parser.add_argument("--west", type=int, default=3, help="learners in west, behind one link")
    parser.add_argument("--link-mbps", type=float, default=20.0, help="west's link, each way")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [one(on, args.tokens, args.west, args.link_mbps, Path(tmp)) for on in (True, False)]
    for row in rows:
        print(json.dumps(row))
    with_relay, without = rows
    print(json.dumps({"west_link_bytes_with_over_without": round(with_relay["west_link_bytes"] / without["west_link_bytes"], 3)}))


if __name__ == "__main__":
    main()
