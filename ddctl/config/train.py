"""The full description of a training run, and its JSON form for tapes.

``TrainConfig`` composes the agents' typed configs with the virtual cluster's
knobs. It round-trips through plain JSON (``to_json``/``from_json``) so a tape
carries everything needed to replay its run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddctl_agents.core.schedule import CADENCES
from ddctl_agents.core.shardmap import MAX_SHARDS
from ddctl_agents.jsonable import from_json, to_json
from ddctl_agents.train.config import ConfigError, require
from ddctl_agents.train.job import JobConfig

__all__ = ["ClusterConfig", "Outage", "TrainConfig", "from_json", "parse_outage", "to_json"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Outage:
    """Learner ``learner`` disappears at virtual time ``at`` and returns ``duration`` s later (never if None)."""

    learner: int
    at: float
    duration: float | None = None

    def __post_init__(self) -> None:
        require(self.learner >= 0, f"outage learner must be >= 0, got {self.learner}")
        require(self.at >= 0, f"outage time must be >= 0, got {self.at}")
        require(self.duration is None or self.duration > 0, f"outage duration must be > 0, got {self.duration}")


_OUTAGE = re.compile(r"^(\d+)@(\d+(?:\.\d+)?)s?(?:\+(\d+(?:\.\d+)?)s?)?$")


def parse_outage(text: str) -> Outage:
    """'L@Ts+Ds' -> Outage: learner L fails at T virtual seconds and returns D seconds later."""
    match = _OUTAGE.match(text.strip())
    if not match:
        raise ConfigError(f"outage {text!r} must look like LEARNER@SECONDS[+SECONDS], e.g. 1@30+20")
    learner, at, duration = match.groups()
    return Outage(learner=int(learner), at=float(at), duration=float(duration) if duration else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """The in-process virtual cluster: learner speeds, links and failures, in virtual time."""

    speeds: tuple[float, ...] = ()
    """Relative speed per learner (1 = nominal); empty means all 1."""
    cadences: tuple[int, ...] = ()
    """Per learner, send each fragment every k periods (k in 1, 2, 4, 8); empty means all 1."""
    outages: tuple[Outage, ...] = ()
    step_time_s: float = 1.0
    """Virtual seconds per inner step at speed 1."""
    jitter: float = 0.05
    """Relative standard deviation of each step's duration."""
    link_mbps: float = 100.0
    """Per-learner link bandwidth to the syncer, each direction (megabits/s)."""
    latency_ms: float = 50.0
    """One-way latency learner <-> syncer."""
    detect_after_steps: float = 3.0
    """Heartbeat timeout, in nominal steps, before the syncer declares a learner gone."""
    shards: int = 1
    """Synchronizer shards, each owning whole fragments (dealt round robin); each writes its own tape."""

    def __post_init__(self) -> None:
        require(all(s > 0 for s in self.speeds), f"speeds must all be > 0, got {self.speeds}")
        require(all(k in CADENCES for k in self.cadences), f"cadences must each be one of {CADENCES}, got {self.cadences}")
        require(self.step_time_s > 0, f"step_time_s must be > 0, got {self.step_time_s}")
        require(0 <= self.jitter < 0.5, f"jitter must be in [0, 0.5), got {self.jitter}")
        require(self.link_mbps > 0, f"link_mbps must be > 0, got {self.link_mbps}")
        require(0 <= self.latency_ms <= 60_000, f"latency_ms must be in [0, 60000], got {self.latency_ms}")
        require(self.detect_after_steps > 0, f"detect_after_steps must be > 0, got {self.detect_after_steps}")
        require(
            not isinstance(self.shards, bool) and isinstance(self.shards, int) and 1 <= self.shards <= MAX_SHARDS,
            f"shards must be an integer in [1, {MAX_SHARDS}], got {self.shards!r}",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig(JobConfig):
    """A job plus the virtual cluster that plays it in one process."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        super(TrainConfig, self).__post_init__()
        m = self.budget.learners
        require(
            not self.cluster.speeds or len(self.cluster.speeds) == m,
            f"give one speed per learner ({m}), got {len(self.cluster.speeds)}",
        )
        require(
            not self.cluster.cadences or len(self.cluster.cadences) == m,
            f"give one cadence per learner ({m}), got {len(self.cluster.cadences)}",
        )
        require(all(o.learner < m for o in self.cluster.outages), f"outage learners must be < learners ({m})")
        require(
            self.cluster.shards <= self.sync.fragments,
            f"shards ({self.cluster.shards}) must not outnumber fragments ({self.sync.fragments}): a shard owns whole fragments",
        )

    def speeds(self) -> tuple[float, ...]:
        return self.cluster.speeds or (1.0,) * self.budget.learners

    def cadences(self) -> tuple[int, ...]:
        return self.cluster.cadences or (1,) * self.budget.learners
