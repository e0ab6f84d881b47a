"""Record dashboard snapshots from a real dry run, for the rendering tests and the SVG in the README.

`python docs/record_dashboard.py OUT_DIR [LEARNERS]` stands up a process-region dry run (three
regions, or LEARNERS learners spread over them), records the syncer's status and ddctl's records,
preempts one region and records again, then takes the run down. Each file holds exactly what
`ddctl.dashboard.snapshot.build` reads.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.control.state import State
from ddctl.dashboard.watch import ask_syncer, run_records

RUNNER = CliRunner()


def regions(learners: int) -> dict[str, Any]:
    names = [("us-east", 1000), ("eu-west", 200), ("ap-south", 50)]
    per = [learners // 3 + (1 if i < learners % 3 else 0) for i in range(3)]
    return {
        "run": "demo",
        "syncer": "us-east",
        "training": {"preset": "tiny", "tokens": 50_000_000, "fragments": 8, "inner_steps": 24, "max_bytes": 1 << 22},
        "regions": [
            {"name": n, "provider": "process", "learners": k, "link": {"up_mbps": r, "down_mbps": r}, "zones": [f"{n}-a"]}
            for (n, r), k in zip(names, per, strict=True)
        ],
    }


def record(run: str, path: Path) -> None:
    with State() as state:
        records = run_records(run, state)
    view = ask_syncer(run)
    data = {"records": asdict(records), "syncer": asdict(view), "now": time.time()}
    path.write_text(json.dumps(data, indent=1, default=str))


def main(out: Path, learners: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    spec = Path("/tmp/ddctl_record_regions.yaml")
    spec.write_text(yaml.safe_dump(regions(learners)))
    up = RUNNER.invoke(app, ["up", "-f", str(spec), "--dry-run", "--json"])
    run = json.loads(up.stdout)["run"]
    try:
        time.sleep(40)
        record(run, out / f"running_{learners}.json")
        if learners == 3:
            RUNNER.invoke(app, ["chaos", "preempt", "eu-west", "--notice", "5"])
            record(run, out / "preempted.json")
    finally:
        RUNNER.invoke(app, ["down", "--run", run])


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)
