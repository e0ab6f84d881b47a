"""Measure a dry run: `python docs/measure_dry_run.py [SECONDS]` (root, for shaped links).

Stands up three process regions shaped like regions.yaml (1000/200/50 Mbit/s),
preempts one learner per region at t = 60, 120 and 180 s (10 s notice), and
reports: time from `ddctl up --dry-run` to the first merged round; for each
preemption, time to the replacement's registration and to its first accepted
update; goodput = learner time spent in training steps / learner-slot time,
over the whole run (start-up and replacement gaps count as lost).
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
from ddctl.up import admin_client, run_dir

RUNNER = CliRunner()
LINKS = {"us-east": 1000, "eu-west": 200, "ap-south": 50}


def regions() -> dict[str, Any]:
    return {
        "run": "measure",
        "syncer": "us-east",
        "training": {"preset": "tiny", "tokens": 50_000_000, "fragments": 8, "inner_steps": 24, "max_bytes": 1 << 22},
        "regions": [
            {"name": name, "provider": "process", "learners": 1, "link": {"up_mbps": rate, "down_mbps": rate}}
            for name, rate in LINKS.items()
        ],
    }


def learners(root: Path, port: int) -> dict[str, dict[str, Any]]:
    client = admin_client(root, f"https://127.0.0.1:{port}")
    try:
        return {entry["id"]: entry for entry in client.status()["learners"]}
    finally:
        client.close()


def merged(entry: dict[str, Any]) -> int:
    return int(entry["updates"].get("accepted", 0) + entry["updates"].get("late", 0))


def main(duration: float) -> dict[str, Any]:
    path = Path("/tmp/ddctl_measure_regions.yaml")
    path.write_text(yaml.safe_dump(regions()))
    t0 = time.time()
    up = json.loads(RUNNER.invoke(app, ["up", "-f", str(path), "--dry-run", "--json"]).stdout)
    root = run_dir(up["run"])
    port = int((root / "syncer.port").read_text())
    rejoin = {}
    for k, region in enumerate(LINKS):
        while time.time() - t0 < 60 * (k + 1):
            time.sleep(0.5)
        before = learners(root, port)
        preempted_at = time.time()
        victim = json.loads(RUNNER.invoke(app, ["chaos", "preempt", region, "--notice", "10", "--json"]).stdout)["instance"]
        exited = time.time() - preempted_at
        after_exit = merged(learners(root, port)[victim])
        while (e := learners(root, port)[victim])["incarnation"] == before[victim]["incarnation"] or not e["live"]:
            time.sleep(0.2)
        registered = time.time() - preempted_at
        while merged(learners(root, port)[victim]) <= after_exit:
            time.sleep(0.2)
        rejoin[region] = {
            "exit_s": round(exited, 2),
            "registered_s": round(registered, 2),
            "first_update_s": round(time.time() - preempted_at, 2),
        }
    while time.time() - t0 < duration:
        time.sleep(1)
    final = learners(root, port)
    ended = time.time()
    RUNNER.invoke(app, ["down", "--run", up["run"]])
    train = sum(
        json.loads(line)["train_seconds"]
        for f in (root / "summaries").glob("*.history.jsonl")
        for line in f.read_text().splitlines()
    )
    slots = len(LINKS) * (ended - t0)
    return {
        "seconds_to_first_round": up["seconds_to_first_round"],
        "rejoin": rejoin,
        "goodput": round(train / slots, 4),
        "train_seconds": round(train, 1),
        "slot_seconds": round(slots, 1),
        "links_mbps": {name: (e["up_mbps"], e["down_mbps"]) for name, e in final.items()},
    }


if __name__ == "__main__":
    print(json.dumps(main(float(sys.argv[1]) if len(sys.argv) > 1 else 300.0), indent=1))
