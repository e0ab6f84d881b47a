"""The provider interface every region kind implements.

A provider creates instances that carry the run's label, lists them by that
label (the label, not local state, is the truth), terminates them, and reports
preemption notices. Local providers also run the agents inside the instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

RUN_LABEL = "ddctl-run"


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceSpec:
    """One instance to create: a syncer or a learner of ``region``."""

    run: str
    name: str
    region: str
    role: str  # syncer | learner
    argv: tuple[str, ...]
    """The agent command the instance runs (python -m ...)."""
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{RUN_LABEL}={self.run}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    name: str
    provider_id: str
    run: str
    alive: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptionNotice:
    instance: str
    seconds_left: float


class Provider(Protocol):
    kind: str

    def create(self, spec: InstanceSpec) -> Instance: ...

    def list_run(self, run: str) -> list[Instance]: ...

    def terminate(self, instance: Instance, grace_s: float = 10.0) -> None: ...

    def notices(self, run: str) -> list[PreemptionNotice]: ...
