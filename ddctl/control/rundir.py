"""A run's directory on this machine, every file in it named once.

``$DDCTL_HOME`` (or ``$XDG_DATA_HOME/ddctl``) holds ``state.sqlite3`` and one
directory per run: its job directory (secret, the run's CA, the syncer's
certificate), SSH keys, tokens, logs, learner summaries, the syncer's
persistent disk and the addresses of the run's services.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ddctl.errors import DdctlError


def data_dir() -> Path:
    if os.environ.get("DDCTL_HOME"):
        return Path(os.environ["DDCTL_HOME"])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ddctl"


@dataclass(frozen=True, slots=True)
class RunDir:
    run: str

    @property
    def root(self) -> Path:
        return data_dir() / "runs" / self.run

    @property
    def job(self) -> Path:
        """The job directory (``ddctl syncer init``'s layout)."""
        return self.root / "job"

    @property
    def ca(self) -> Path:
        return self.job / "tls" / "ca.pem"

    @property
    def syncer_url(self) -> Path:
        """Where ``up`` records the URL this machine reaches the syncer at."""
        return self.root / "syncer.url"

    @property
    def syncer_state(self) -> Path:
        """The syncer's persistent disk (its snapshots and log), for a syncer on a machine of its own."""
        return self.root / "syncer-state"

    def tape(self) -> Path:
        """The synchronizer's event tape: in its state directory here, or on its persistent disk."""
        places = [self.job / "state" / "tape.jsonl", self.syncer_state / "tape.jsonl"]
        found = [place for place in places if place.is_file()]
        if not found:
            raise DdctlError(f"run {self.run} has no synchronizer tape (looked at {places[0]} and {places[1]})")
        return found[0]

    @property
    def resume(self) -> Path:
        """The checkpoint a resumed run's syncer starts from (``up --resume-from``), copied into the job."""
        return self.job / "resume"

    def checkpoints(self, local: bool) -> Path:
        """Where the syncer writes checkpoints, as this machine sees them: its state dir, or its persistent disk."""
        return (self.job / "state" if local else self.syncer_state) / "checkpoints"

    @property
    def metadata_port(self) -> Path:
        """The local instance-metadata endpoint's port (Docker regions)."""
        return self.root / "metadata.port"

    @property
    def ssh_key(self) -> Path:
        """The run's own ed25519 client key."""
        return self.root / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """The host keys ddctl made for the run's machines, pinned."""
        return self.root / "ssh" / "known_hosts"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def token(self, learner: str) -> Path:
        return self.root / "tokens" / learner

    def summary(self, learner: str) -> Path:
        return self.root / "summaries" / f"{learner}.json"


def run_dir(run: str) -> Path:
    """Where a run keeps its job directory, keys, logs and summaries on this machine."""
    return RunDir(run).root
