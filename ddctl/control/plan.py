"""What ``ddctl up`` would create for a regions file, and what it may cost: pure, no side effects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddctl.config.regions import LOCAL_PROVIDERS, Region, RegionsFile


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedInstance:
    name: str
    region: str
    provider: str
    role: str
    learner: str | None
    instance_type: str
    spot: bool
    max_dollars_per_hour: float | None
    """0 for local regions; the region's price cap for clouds; None when no cap bounds it."""


def learner_names(rf: RegionsFile) -> dict[str, list[str]]:
    """Learner names L0..L{M-1}, handed out region by region in file order (each name is a data shard)."""
    names: dict[str, list[str]] = {}
    next_index = 0
    for region in rf.regions:
        names[region.name] = [f"L{next_index + i}" for i in range(region.learners)]
        next_index += region.learners
    return names


def price(region: Region) -> float | None:
    """USD per instance-hour: 0 for local regions, the price cap for clouds, None when nothing bounds it."""
    return 0.0 if region.provider in LOCAL_PROVIDERS else region.price_cap


def plan(rf: RegionsFile, run: str) -> list[PlannedInstance]:
    out = []
    names = learner_names(rf)
    for region in rf.regions:
        roles: list[tuple[str, str | None]] = [("syncer", None)] if region.name == rf.syncer else []
        roles += [("learner", learner) for learner in names[region.name]]
        for role, learner in roles:
            out.append(
                PlannedInstance(
                    name=f"{run}-{learner or 'syncer'}",
                    region=region.name,
                    provider=region.provider,
                    role=role,
                    learner=learner,
                    instance_type=region.instance_type,
                    spot=region.spot,
                    max_dollars_per_hour=price(region),
                )
            )
    return out


def plan_summary(rf: RegionsFile, run: str) -> dict[str, Any]:
    instances = plan(rf, run)
    known = [i.max_dollars_per_hour for i in instances if i.max_dollars_per_hour is not None]
    return {
        "run": run,
        "syncer_region": rf.syncer,
        "learners": rf.learners,
        "instances": [
            {
                "name": i.name,
                "region": i.region,
                "provider": i.provider,
                "role": i.role,
                "learner": i.learner,
                "instance_type": i.instance_type,
                "spot": i.spot,
                "max_dollars_per_hour": i.max_dollars_per_hour,
            }
            for i in instances
        ],
        "max_dollars_per_hour": round(sum(known), 4),
        "unpriced": sorted({i.region for i in instances if i.max_dollars_per_hour is None}),
    }
