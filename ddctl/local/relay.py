"""A region's relay process on this machine, for a job a ``LocalSyncer`` serves (tests, ``bench relay``).

The relay gets the region's key (``credentials.relay_key_for``) in a file of its
own, its token for the shards (identity ``relay-REGION``) in another, and the
region's relay certificate (``credentials.relay_tls``): learners check its name,
not the address it listens at.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddctl.control.credentials import relay_key_for, relay_tls, relay_token_for, write_private
from ddctl.local.service import LocalProcess, LocalSyncer
from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.relay import identity, server_name


class LocalRelay(LocalProcess):
    name = "relay"

    def __init__(
        self, syncer: LocalSyncer, region: str, shards: Sequence[str] = (), *, host: str = "", prefix: Sequence[str] = ()
    ) -> None:
        """``shards``: every shard's URL (default: the syncer's); ``host``: where it listens (default: where the syncer
        does); ``prefix``: the command runs inside it (a region's namespace)."""
        self.syncer, self.region, self.shards, self.prefix = syncer, region, tuple(shards), tuple(prefix)
        self.host = host or syncer.host
        self.root = syncer.root / f"relay-{region}"
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.syncer.tls else 'http'}://{self.host}:{self.port}"

    def learner_token_file(self, learner: str) -> Path:
        """A file holding ``learner``'s token for this relay (``--relay-token-file``)."""
        return write_private(self.root / f"{learner}.token", relay_token_for(self.syncer.job_dir, self.region, learner))

    def client(self, learner: str = "health") -> SyncerClient:
        token = relay_token_for(self.syncer.job_dir, self.region, learner)
        return SyncerClient(self.url, token, self.syncer.ca, server_name=server_name(self.region))

    def health(self) -> dict[str, Any]:
        """What the relay's health probe says: whether it serves, and its byte counters both ways."""
        client = self.client()
        try:
            return client.health()
        finally:
            client.close()

    def start(self, *extra: str, timeout_s: float = 120.0) -> LocalRelay:
        key = write_private(self.root / "key", relay_key_for(self.syncer.job_dir, self.region).hex())
        token = write_private(self.root / "token", self.syncer.token(identity(self.region)))
        args = [f"--syncer={url}" for url in self.shards or (self.syncer.url,)]
        args += ["--region", self.region, "--key-file", str(key), "--token-file", str(token), "--bind", f"{self.host}:0"]
        if self.syncer.tls:
            cert, tls_key = relay_tls(self.syncer.job_dir, self.region)
            args += ["--ca", str(self.syncer.ca), "--tls-cert", str(cert), "--tls-key", str(tls_key)]
        else:
            args.append("--plaintext")
        self.launch("ddctl_agents.relay", [*args, *extra], timeout_s)
        return self
