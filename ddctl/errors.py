"""Every error of the laptop side, in one tree (no torch needed); each carries the fields it is about.

    DdctlError                    the laptop side's own errors
    ├── RegionsError              regions.yaml unreadable or invalid (path, key)
    ├── SimError                  a simulator setting out of range
    ├── ReplayDivergence          a replay did something other than its tape recorded (line)
    ├── WorkerError               a data-parallel worker failed, died or timed out
    ├── UnreachableError          a machine, the Docker engine or a syncer did not answer (host)
    │   ├── DeployError           SSH or SFTP to a machine failed (host)
    │   └── EngineError           the Docker Engine API answered an error (status: its HTTP code)
    └── ProvisionError            a provider could not do what was asked (kind, scope, code, region, zone)

The agents side has its own tree (``ddctl_agents.errors``); ``ddctl.cli.errors``
maps both to exit codes in one table. Foreign errors (botocore, the Engine API,
asyncssh) are translated once, where they are caught, into these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal


class DdctlError(Exception):
    """Root of the laptop side's own errors."""


class RegionsError(DdctlError):
    """regions.yaml is unreadable or invalid; the message names the file, the key and what is allowed."""

    def __init__(self, message: str, *, path: Path | None = None, key: str = "") -> None:
        super().__init__(message)
        self.path, self.key = path, key


class SimError(DdctlError):
    """A simulator setting is out of range; the message names it and the range."""


class ReplayDivergence(DdctlError):
    """The replayed run did something other than what the tape recorded."""


class WorkerError(DdctlError):
    """A data-parallel worker failed, died or timed out; the message carries its traceback."""


class UnreachableError(DdctlError):
    """A machine (SSH), the Docker engine or a run's syncer did not answer; retrying later may work."""

    def __init__(self, message: str, *, host: str = "") -> None:
        super().__init__(message)
        self.host = host


class DeployError(UnreachableError):
    """Connecting to a machine over SSH or copying to it failed."""


class EngineError(UnreachableError):
    """The Docker Engine API refused a call; ``status`` is its HTTP code (0: no answer at all)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


ProvisionKind = Literal["capacity", "quota", "credentials", "transient", "config"]
"""capacity: the zone has none now; quota: an account limit; credentials: not allowed;
transient: try again; config: the request itself is wrong."""
ProvisionScope = Literal["zone", "region", "cloud"]
"""How far the problem reaches: what failover must avoid next."""


class ProvisionError(DdctlError):
    """A provider could not do what was asked, classified so that failover can decide what to try next."""

    def __init__(
        self,
        message: str,
        *,
        kind: ProvisionKind,
        scope: ProvisionScope,
        code: str = "",
        provider: str = "",
        region: str = "",
        zone: str = "",
    ) -> None:
        super().__init__(message)
        self.kind, self.scope, self.code = kind, scope, code
        self.provider, self.region, self.zone = provider, region, zone

    @property
    def where(self) -> str:
        """The scope's name: the zone, the region or the cloud this error blocks."""
        return {"zone": self.zone or self.region, "region": self.region, "cloud": self.provider}[self.scope]
