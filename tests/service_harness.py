"""Real syncer and learner processes on loopback, for the service tests.

Everything is a subprocess speaking real HTTP/2 (TLS with the job's own CA by
default); the harness only starts, waits, reads status and kills.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddctl.local.service import LocalSyncer, tiny_job
from ddctl_agents.agent.client import SyncerClient, Unavailable
from ddctl_agents.train.job import JobConfig
from ddctl_agents.waiting import wait_until

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


small_job = tiny_job


@dataclass
class Job:
    """A job directory, its syncer (a LocalSyncer) and its learner processes."""

    root: Path
    local: LocalSyncer
    learners: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @classmethod
    def create(cls, root: Path, job: JobConfig, tls: bool = True, host: str = "127.0.0.1") -> Job:
        """``host``: where the syncer listens (a shaped link's host end, for learners in its namespace)."""
        return cls(root=root, local=LocalSyncer(root, job, run="test-run", tls=tls, host=host))

    @property
    def job_dir(self) -> Path:
        return self.local.job_dir

    @property
    def url(self) -> str:
        return self.local.url

    @property
    def tls(self) -> bool:
        return self.local.tls

    @property
    def syncer(self) -> subprocess.Popen[bytes] | None:
        return self.local.process

    def token(self, identity: str) -> str:
        return self.local.token(identity)

    def client(self, identity: str = "admin", token: str | None = None) -> SyncerClient:
        return self.local.client(identity, token)

    def start_syncer(self, *extra: str) -> None:
        self.local.start(*extra)

    def start_learner(self, name: str, *extra: str, region: str = "", prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        args = ["--syncer", self.url, "--name", name, "--token", self.token(name), "--summary", str(self.summary_path(name))]
        if self.tls:
            args += ["--ca", str(self.job_dir / "tls" / "ca.pem")]
        region_args = ["--region", region or f"region-{name}"]
        command = [*prefix, sys.executable, "-m", "ddctl_agents.agent", *args, *region_args, *extra]
        with (self.root / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=log, env=ENV)
        self.learners[name] = proc
        return proc

    def summary_path(self, name: str) -> Path:
        return self.root / f"{name}.summary.json"

    def summary(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.summary_path(name).read_text()))

    def status(self) -> dict[str, Any]:
        client = self.client()
        try:
            return client.status()
        finally:
            client.close()

    def wait_for(self, predicate: Any, timeout_s: float, what: str) -> dict[str, Any]:
        last: list[dict[str, Any]] = []

        def matching() -> dict[str, Any] | None:
            try:
                status = self.status()
            except Unavailable:
                return None
            last[:] = [status]
            return status if predicate(status) else None

        def timed_out(message: str) -> TimeoutError:
            if not last:
                return TimeoutError(f"{message}; logs in {self.root}; no status answered")
            seen = json.dumps({"learners": last[0].get("learners"), "rounds": last[0].get("rounds")})[:6000]
            return TimeoutError(f"{message}; logs in {self.root}; the last status's learners: {seen}")

        return wait_until(matching, timeout_s=timeout_s, every_s=0.2, what=what, error=timed_out)

    def wait_learners(self, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        for name, proc in self.learners.items():
            code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
            assert code == 0, f"learner {name} exited {code}: {self.log(name)[-2000:]}"

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.learners.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        self.local.kill()
