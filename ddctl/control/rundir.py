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

TAPE = "tape.jsonl"
"""A synchronizer's event tape, in its state directory (``ddctl replay`` reads it)."""


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
    def docker_addresses(self) -> Path:
        """Every address the Docker provider handed a learner's VM in this run, one per line (``docker/addresses``)."""
        return self.root / "docker-addresses"

    @property
    def syncer_url(self) -> Path:
        """Where ``up`` records the URL this machine reaches the syncer (a sharded one's first shard) at."""
        return self.root / "syncer.url"

    @property
    def shard_urls(self) -> Path:
        """Where ``up`` records every shard's URL of a sharded synchronizer, one per line, in shard order."""
        return self.root / "shards.url"

    def urls(self) -> list[str]:
        """The URL of each synchronizer process of the run: its shards' in order, or its one syncer's."""
        if self.shard_urls.is_file():
            return self.shard_urls.read_text().split()
        return [self.syncer_url.read_text().strip()]

    def disk(self, shard: str = "") -> Path:
        """A synchronizer's persistent disk (its snapshots, log and tape) on this machine, for one on a machine of its
        own: ``syncer-state`` for the syncer (a sharded one's S0), ``syncer-state-S1``.."""
        return self.root / ("syncer-state" if shard in ("", "S0") else f"syncer-state-{shard}")

    def state(self, shard: str = "") -> Path:
        """A local synchronizer's state directory: ``state`` for the syncer (a sharded one's S0), ``state-S1``.."""
        return self.job / ("state" if shard in ("", "S0") else f"state-{shard}")

    def tapes(self) -> list[Path]:
        """The synchronizer's event tapes (every shard's): in its state directories here, or on its persistent disks."""
        for places in (
            [self.state(), *sorted(self.job.glob("state-S*"))],
            [self.disk(), *sorted(self.root.glob("syncer-state-S*"))],
        ):
            found = [place / TAPE for place in places if (place / TAPE).is_file()]
            if found:
                return found
        raise DdctlError(f"run {self.run} has no synchronizer tape (looked at {self.state() / TAPE} and {self.disk() / TAPE})")

    @property
    def final(self) -> Path:
        """A sharded run's final model: the shards' global checkpoint, joined here when the job ends."""
        return self.root / "final"

    @property
    def global_checkpoints(self) -> Path:
        """A sharded run's checkpoints, each the shards' global checkpoint taken by the controller on the run's schedule."""
        return self.root / "checkpoints"

    @property
    def resume(self) -> Path:
        """The checkpoint a resumed run's syncer starts from (``up --resume-from``), copied into the job."""
        return self.job / "resume"

    def checkpoints(self, local: bool) -> Path:
        """Where the syncer writes checkpoints, as this machine sees them: its state dir, or its persistent disk."""
        return (self.state() if local else self.disk()) / "checkpoints"

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

    def relay_token(self, learner: str) -> Path:
        """``learner``'s token for its region's relay."""
        return self.root / "tokens" / f"{learner}.relay"

    def relay_files(self, region: str) -> Path:
        """What region ``region``'s relay host is given (``agent/relay_host.py``: its token, key and certificate)."""
        return self.root / "relays" / region

    def summary(self, learner: str) -> Path:
        return self.root / "summaries" / f"{learner}.json"


def run_dir(run: str) -> Path:
    """Where a run keeps its job directory, keys, logs and summaries on this machine."""
    return RunDir(run).root
