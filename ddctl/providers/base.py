"""The provider interface every region kind implements.

A provider creates instances that carry the run's label, lists them by that
label (the label, not local state, is the truth), terminates them, preempts
them with a notice, and cleans up what a run leaves besides instances
(networks, namespaces). An instance runs one agent; when the agent ends the
instance is no longer alive, which is what the controller watches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

RUN_LABEL = "ddctl-run"
NAME_LABEL = "ddctl-name"


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceSpec:
    """One instance to create: a syncer, a learner, or a helper process of ``region``."""

    run: str
    name: str
    region: str
    role: str  # syncer | learner | controller | metadata
    argv: tuple[str, ...]
    """The agent command the instance runs (python -m ...), with paths as the instance sees them."""
    log: Path
    """Where this machine keeps the instance's log (collected from remote instances)."""
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    """Remote path -> local path of files copied into a remote instance (tokens, TLS, job)."""
    disks: dict[str, str] = field(default_factory=dict)
    """Remote path -> local directory that outlives the instance (the syncer's state)."""
    link: tuple[float, float] | None = None
    """(up, down) Mbit/s this instance's link is shaped to, where the provider shapes links."""
    summary: str = ""
    """Where the agent writes its exit summary, as the instance sees it."""

    @property
    def label(self) -> str:
        return f"{RUN_LABEL}={self.run}"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["log"], out["argv"] = str(self.log), list(self.argv)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> InstanceSpec:
        link = raw.get("link")
        return cls(
            **{
                **raw,
                "argv": tuple(raw["argv"]),
                "log": Path(raw["log"]),
                "link": None if link is None else (float(link[0]), float(link[1])),
            }
        )


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

    def list_run(self, run: str) -> list[Instance]:
        """Every instance labelled with ``run``; ``alive`` is False once its agent has ended."""
        ...

    def terminate(self, instance: Instance, grace_s: float = 10.0) -> None:
        """Ask the agent to leave (SIGTERM), wait up to ``grace_s``, then remove the instance."""
        ...

    def preempt(self, instance: Instance, notice_s: float) -> None:
        """A spot interruption: the notice now, the kill ``notice_s`` later (sooner if the agent has left)."""
        ...

    def notices(self, run: str) -> list[PreemptionNotice]: ...

    def read_file(self, instance: Instance, path: str) -> bytes | None:
        """A file of the instance (alive or not); None if it is not there."""
        ...

    def retire(self, instance: Instance, log: Path) -> None:
        """Collect the log of an instance whose agent ended into ``log``, then remove what is left of it."""
        ...

    def cleanup(self, run: str) -> list[str]:
        """Remove what the run left besides instances (networks, namespaces); returns their names."""
        ...
