"""Turn ``ddctl train``'s flat options into a validated TrainConfig (through ``config.job.build_job``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ddctl.config.job import build_job
from ddctl.config.train import ClusterConfig, Outage, TrainConfig, parse_outage
from ddctl_agents.train.config import ConfigError

T = TypeVar("T")


def parse_speeds(text: str) -> tuple[float, ...]:
    return _comma_list(text, float, "--speeds", "numbers, e.g. 1,1,0.5")


def parse_cadences(text: str) -> tuple[int, ...]:
    return _comma_list(text, int, "--cadences", "integers (1, 2, 4 or 8), e.g. 1,1,1,4")


def _comma_list(text: str, kind: Callable[[str], T], option: str, allowed: str) -> tuple[T, ...]:
    """``text`` split at commas, each part read as ``kind``; empty text is an empty tuple."""
    if not text.strip():
        return ()
    try:
        return tuple(kind(s) for s in text.split(","))
    except ValueError:
        raise ConfigError(f"{option} {text!r} must be comma-separated {allowed}") from None


def build_config(knobs: dict[str, Any], cluster: dict[str, Any]) -> TrainConfig:
    """The knobs through the one JobConfig builder, then the virtual cluster (it needs the learner count)."""
    config = build_job(knobs, base=TrainConfig())
    learners = config.budget.learners
    outages = (*(parse_outage(t) for t in cluster["outages"]), *_tape_outages(cluster["failures"], learners))
    links = {k: cluster[k] for k in ("link_mbps", "latency_ms") if cluster[k] is not None}
    speeds, cadences = parse_speeds(cluster["speeds"]), parse_cadences(cluster.get("cadences", ""))
    layout = {"speeds": speeds, "cadences": cadences, "outages": outages, "shards": cluster.get("shards", 1)}
    return dataclasses.replace(config, cluster=ClusterConfig(**layout, **links))


DECOUPLED_ONLY: dict[str, Any] = {
    "speeds": "", "cadences": "", "outages": [], "failures": None, "link_mbps": None, "latency_ms": None, "shards": 1,
    "tape": None,
}  # fmt: skip
"""The virtual cluster's options, at their defaults: the data-parallel baseline has no cluster, tape or shards."""


def refuse_decoupled_only(given: dict[str, Any]) -> None:
    """Refuse, naming them, the options ``--baseline dp`` would otherwise silently ignore."""
    set_ = [k for k, default in DECOUPLED_ONLY.items() if given.get(k, default) != default]
    if set_:
        options = ", ".join("--" + ("outage" if k == "outages" else k.replace("_", "-")) for k in set_)
        raise ConfigError(
            f"{options}: only a Decoupled run has a virtual cluster, tapes and shards; "
            "--baseline dp trains synchronously in M processes (drop them, or drop --baseline)"
        )


def _tape_outages(path: Path | None, learners: int) -> tuple[Outage, ...]:
    """The failures of an availability tape (``ddctl simulate --tape``), if one was given."""
    if path is None:
        return ()
    from ddctl.goodput.timeline import outages_from_tape

    return outages_from_tape(path, learners)
