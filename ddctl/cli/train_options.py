"""Turn ``ddctl train``'s flat options into a validated TrainConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddctl.settings import ClusterConfig, Outage, TrainConfig, parse_outage
from ddctl_agents.core.outer import OuterConfig
from ddctl_agents.core.quorum import QuorumConfig
from ddctl_agents.core.syncer import SyncerConfig
from ddctl_agents.train.config import ConfigError, DataConfig, InnerConfig, RunBudget
from ddctl_agents.train.learner import SyncSettings


def parse_speeds(text: str) -> tuple[float, ...]:
    if not text.strip():
        return ()
    try:
        return tuple(float(s) for s in text.split(","))
    except ValueError:
        raise ConfigError(f"--speeds {text!r} must be comma-separated numbers, e.g. 1,1,0.5") from None


def _value(x: Any) -> Any:
    return getattr(x, "value", x)


def build_config(o: dict[str, Any]) -> TrainConfig:
    """Every flag lands in exactly one typed config; each validates its own ranges."""
    quorum = QuorumConfig(quorum=o["quorum"], grace=o["grace"], overlap=o["overlap"])
    outer = OuterConfig(lr=o["outer_lr"], momentum=o["outer_momentum"])
    sync = SyncSettings(
        fragments=o["fragments"],
        inner_steps=o["inner_steps"],
        codec=_value(o["codec"]),
        error_feedback=o["error_feedback"],
        push_before_overwrite=o["push_before_overwrite"],
    )
    syncer = SyncerConfig(quorum=quorum, outer=outer, merge=_value(o["merge"]), inner_steps=o["inner_steps"])
    return TrainConfig(
        inner=InnerConfig(preset=o["preset"], batch_size=o["batch_size"], lr=o["lr"], seed=o["seed"]),
        data=DataConfig(paths=tuple(o["data"]), max_bytes=o["max_bytes"]),
        budget=RunBudget(tokens=o["tokens"], learners=o["learners"]),
        sync=sync,
        syncer=syncer,
        fragmentation=_value(o["fragmentation"]),
        down_codec=o["down_codec"],
        cluster=ClusterConfig(
            speeds=parse_speeds(o["speeds"]),
            outages=(*(parse_outage(t) for t in o["outage"]), *_tape_outages(o["failures"], o["learners"])),
            link_mbps=o["link_mbps"],
            latency_ms=o["latency_ms"],
        ),
        threads=o["threads"],
    )


def _tape_outages(path: Path | None, learners: int) -> tuple[Outage, ...]:
    """The failures of an availability tape (``ddctl simulate --tape``), if one was given."""
    if path is None:
        return ()
    from ddctl.goodput.timeline import outages_from_tape

    return outages_from_tape(path, learners)
