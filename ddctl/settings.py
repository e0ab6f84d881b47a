"""The full description of a training run, and its JSON form for tapes.

``TrainConfig`` composes the agents' typed configs with the virtual cluster's
knobs. It round-trips through plain JSON (``to_json``/``from_json``) so a tape
carries everything needed to replay its run.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddctl_agents.core.codec import CODECS
from ddctl_agents.core.fragments import STRATEGIES
from ddctl_agents.core.syncer import SyncerConfig
from ddctl_agents.train.config import ConfigError, DataConfig, InnerConfig, RunBudget, require
from ddctl_agents.train.learner import SyncSettings


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

    def __post_init__(self) -> None:
        require(all(s > 0 for s in self.speeds), f"speeds must all be > 0, got {self.speeds}")
        require(self.step_time_s > 0, f"step_time_s must be > 0, got {self.step_time_s}")
        require(0 <= self.jitter < 0.5, f"jitter must be in [0, 0.5), got {self.jitter}")
        require(self.link_mbps > 0, f"link_mbps must be > 0, got {self.link_mbps}")
        require(self.latency_ms >= 0, f"latency_ms must be >= 0, got {self.latency_ms}")
        require(self.detect_after_steps > 0, f"detect_after_steps must be > 0, got {self.detect_after_steps}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    """One training run, Decoupled or data-parallel, fully specified."""

    inner: InnerConfig = field(default_factory=InnerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    budget: RunBudget = field(default_factory=RunBudget)
    sync: SyncSettings = field(default_factory=lambda: SyncSettings(fragments=8, inner_steps=24))
    syncer: SyncerConfig = field(default_factory=SyncerConfig)
    fragmentation: str = "balanced"
    down_codec: str = "bf16"
    """Codec of fragments sent back to learners (outer gradients use sync.codec)."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    threads: int = 1
    """torch intra-op threads; fixed so that runs and replays are bit-identical."""

    def __post_init__(self) -> None:
        require(
            self.fragmentation in STRATEGIES, f"fragmentation must be one of {', '.join(STRATEGIES)}, got {self.fragmentation!r}"
        )
        require(
            self.down_codec in ("fp32", "bf16"),
            f"down codec must be fp32 or bf16 (fragments stay near-lossless), got {self.down_codec!r}",
        )
        require(self.sync.inner_steps == self.syncer.inner_steps, "sync.inner_steps and syncer.inner_steps must agree")
        m = self.budget.learners
        require(
            not self.cluster.speeds or len(self.cluster.speeds) == m,
            f"give one speed per learner ({m}), got {len(self.cluster.speeds)}",
        )
        require(all(o.learner < m for o in self.cluster.outages), f"outage learners must be < learners ({m})")
        require(self.threads >= 1, f"threads must be >= 1, got {self.threads}")
        require(self.sync.codec in CODECS, f"codec must be one of {', '.join(CODECS)}")

    def speeds(self) -> tuple[float, ...]:
        return self.cluster.speeds or (1.0,) * self.budget.learners


def to_json(value: Any) -> Any:
    """Dataclasses, tuples and paths as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def from_json(cls: type, data: Any) -> Any:
    """Rebuild ``cls`` from ``to_json`` output, validating through the dataclasses."""
    if not isinstance(data, dict):
        raise ConfigError(f"{cls.__name__} must be a JSON object")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} keys: {', '.join(sorted(unknown))}")
    return cls(**{k: _coerce(hints[k], v) for k, v in data.items()})


def _coerce(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_json(hint, value)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return None if value is None else _coerce(options[0], value)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v) for v in value)
        if not isinstance(value, list) or len(value) != len(args):
            raise ConfigError(f"expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(a, v) for a, v in zip(args, value, strict=True))
    if hint is Path:
        return Path(value)
    if hint is float and isinstance(value, int):
        return float(value)
    return value
