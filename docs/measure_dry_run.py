"""Measure a dry run: `python docs/measure_dry_run.py [SECONDS] [docker|process]` (root, for shaped links).

Stands up three regions (Docker VMs by default) shaped like regions.yaml (1000/200/50 Mbit/s),
preempts one learner per region at t = 60, 120 and 180 s (10 s notice), and
reports: time from `ddctl up --dry-run` to the first merged round; for each
preemption, time to the replacement's registration and to its first accepted
update; goodput = learner time spent in training steps / learner-slot time,
over the whole run (start-up and replacement gaps count as lost). Training
time comes from the exit summaries every incarnation prints to its log.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.control.rundir import run_dir
from ddctl.control.up import admin_client

RUNNER = CliRunner()
LINKS = {"us-east": 1000, "eu-west": 200, "ap-south": 50}


def regions(provider: str) -> dict[str, Any]:
    return {
        "run": "measure",
        "syncer": "us-east",
        "training": {"preset": "tiny", "tokens": 50_000_000, "fragments": 8, "inner_steps": 24, "max_bytes": 1 << 22},
        "regions": [
            {"name": name, "provider": provider, "learners": 1, "link": {"up_mbps": rate, "down_mbps": rate}}
            for name, rate in LINKS.items()
        ],
    }


def learners(root: Path) -> dict[str, dict[str, Any]]:
    client = admin_client(root.name)
    try:
        return {entry["id"]: entry for entry in client.status()["learners"]}
    finally:
        client.close()


def merged(entry: dict[str, Any]) -> int:
    return int(entry["updates"].get("accepted", 0) + entry["updates"].get("late", 0))


def summaries(logs: Path) -> list[dict[str, Any]]:
    """Every incarnation's exit summary, from the learners' (collected) logs."""
    out = []
    for log in logs.glob("L*.log"):
        out += [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{") and '"train_seconds"' in line]
    return out


def main(duration: float, provider: str) -> dict[str, Any]:
    path = Path("/tmp/ddctl_measure_regions.yaml")
    path.write_text(yaml.safe_dump(regions(provider)))
    t0 = time.time()
    up = json.loads(RUNNER.invoke(app, ["up", "-f", str(path), "--dry-run", "--json"]).stdout)
    root = run_dir(up["run"])
    rejoin = {}
    for k, region in enumerate(LINKS):
        while time.time() - t0 < 60 * (k + 1):
            time.sleep(0.5)
        before = learners(root)
        preempted_at = time.time()
        victim = json.loads(RUNNER.invoke(app, ["chaos", "preempt", region, "--notice", "10", "--json"]).stdout)["instance"]
        exited = time.time() - preempted_at
        after_exit = merged(learners(root)[victim])
        while (e := learners(root)[victim])["incarnation"] == before[victim]["incarnation"] or not e["live"]:
            time.sleep(0.2)
        registered = time.time() - preempted_at
        while merged(learners(root)[victim]) <= after_exit:
            time.sleep(0.2)
        rejoin[region] = {
            "exit_s": round(exited, 2),
            "registered_s": round(registered, 2),
            "first_update_s": round(time.time() - preempted_at, 2),
        }
    while time.time() - t0 < duration:
        time.sleep(1)
    final = learners(root)
    ended = time.time()
    RUNNER.invoke(app, ["down", "--run", up["run"]])
    ran = summaries(root / "logs")
    train = sum(s["train_seconds"] for s in ran)
    slots = len(LINKS) * (ended - t0)
    return {
        "provider": up["provider"],
        "incarnations": len(ran),
        "seconds_to_first_round": up["seconds_to_first_round"],
        "rejoin": rejoin,
        "goodput": round(train / slots, 4),
        "train_seconds": round(train, 1),
        "slot_seconds": round(slots, 1),
        "links_mbps": {name: (e["up_mbps"], e["down_mbps"]) for name, e in final.items()},
    }


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 300.0
    print(json.dumps(main(seconds, sys.argv[2] if len(sys.argv) > 2 else "docker"), indent=1))
