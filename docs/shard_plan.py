"""The scheduler's predictions for issue 19's four layouts on one regions file (docs/benchmarks.md).

``.venv/bin/python docs/shard_plan.py docs/examples/wan5.yaml`` prints, for N (one synchronizer, every
region sending every period, no relays), N-rr (three shards, fragments in turn), P2 (one synchronizer
with cadence and relays) and W (the full plan): the busiest link, the busiest shard site, and each
region's cadence. Predictions from the file's priors, not measurements.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from ddctl.config import synchronizer
from ddctl.config.regions import job_config, parse_regions


def layout(raw: dict[str, Any], section: dict[str, Any], every_period: bool) -> dict[str, Any]:
    regions = [{**r, "cadence": 1} if every_period else r for r in raw["regions"]]
    rf = parse_regions({**raw, "synchronizer": section, "regions": regions}, Path("layout.yaml"))
    return synchronizer.summary(rf, job_config(rf))


def main(path: str) -> None:
    raw = yaml.safe_load(Path(path).read_text())
    raw.pop("syncer", None)
    first = [raw["regions"][0]["name"]]
    layouts = {
        "N": layout(raw, {"shards": 1, "regions": first, "relays": False}, every_period=True),
        "N-rr": layout(raw, {"shards": 3, "relays": False}, every_period=True),
        "P2": layout(raw, {"shards": 1, "regions": first}, every_period=False),
        "W": layout(raw, {"shards": "auto"}, every_period=False),
    }
    print("| layout | shards at | busiest link | busiest shard site | cadence by region |")
    print("|---|---|---|---|---|")
    for name, plan in layouts.items():
        hosting = {s["region"] for s in plan["shards"]}
        shard_site = max(s["utilisation"] for s in plan["sites"] if s["region"] in hosting)
        cadence = ", ".join(f"{s['region']} {s['cadence']}" for s in plan["sites"])
        sites = ", ".join(sorted(hosting))
        print(f"| {name} | {sites} | {plan['utilisation']:.1%} | {shard_site:.1%} | {cadence} |")


if __name__ == "__main__":
    main(sys.argv[1])
