"""A syncer service process on this machine: job directory, start, health, kill, restart.

Benchmarks and the ``process`` provider start the real service this way, as a
separate process speaking HTTP/2 (TLS with the job's CA unless ``tls=False``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ddctl.control.credentials import init_job_dir, token_for
from ddctl.errors import DdctlError
from ddctl_agents.agent.client import SyncerClient, Unavailable
from ddctl_agents.core.config import OuterConfig, SyncerConfig
from ddctl_agents.core.quorum import QuorumConfig
from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget, SyncSettings
from ddctl_agents.train.job import JobConfig
from ddctl_agents.waiting import wait_until


def tiny_job(learners: int = 3, tokens: int = 150_000, fragments: int = 4, inner_steps: int = 8, quorum: int = 1) -> JobConfig:
    """A job small enough for two cores to run several learner processes of (the service tests' and benchmarks')."""
    return JobConfig(
        inner=InnerConfig(preset="tiny", batch_size=8),
        data=DataConfig(max_bytes=1 << 21, eval_windows=16),
        budget=RunBudget(tokens=tokens, learners=learners),
        sync=SyncSettings(fragments=fragments, inner_steps=inner_steps),
        syncer=SyncerConfig(quorum=QuorumConfig(quorum=quorum), outer=OuterConfig(), inner_steps=inner_steps),
    )


class LocalProcess:
    """A service process of ours on this machine (a syncer, a relay): start it, wait for its health probe, stop it."""

    name = "process"
    root: Path
    prefix: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    port = 0

    @property
    def log_path(self) -> Path:
        return self.root / f"{self.name}.log"

    def client(self) -> SyncerClient:
        """A client that can ask the process's health probe."""
        raise NotImplementedError

    def launch(self, module: str, args: Sequence[str], timeout_s: float) -> None:
        """Run ``python -m module args --port-file F`` and return once it answers its health probe."""
        port_file = self.root / f"{self.name}.port"
        port_file.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            command = [*self.prefix, sys.executable, "-m", module, *args, "--port-file", str(port_file)]
            self.process = subprocess.Popen(command, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + timeout_s

        def bound() -> str:
            self._alive_or_raise()
            return port_file.read_text().strip() if port_file.exists() else ""

        self.port = int(
            wait_until(bound, timeout_s=timeout_s, every_s=0.05, what=f"the {self.name} to bind its port", error=self._late)
        )
        client = self.client()

        def healthy() -> bool:
            self._alive_or_raise()
            try:
                return bool(client.health())
            except Unavailable:
                return False

        try:
            left = max(deadline - time.monotonic(), 0.0)
            wait_until(healthy, timeout_s=left, what=f"the {self.name} to answer its health probe", error=self._late)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: no shutdown snapshot, no goodbye."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM: a graceful shutdown that takes a final snapshot."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def _alive_or_raise(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise DdctlError(f"the {self.name} exited with {self.process.returncode}:\n{tail}")

    def _late(self, message: str) -> DdctlError:
        return DdctlError(f"{message}; see {self.log_path}")


class LocalSyncer(LocalProcess):
    """One job's syncer process; ``start`` may be called again after ``kill`` (same port, same state)."""

    name = "syncer"

    def __init__(
        self,
        root: Path,
        job: JobConfig | None = None,
        run: str = "local",
        tls: bool = True,
        host: str = "127.0.0.1",
        *,
        also: Sequence[str] = (),
        prefix: Sequence[str] = (),
    ) -> None:
        """``also``: more addresses the job's certificate names (other shards'); ``prefix``: the command runs inside it
        (``ip netns exec NS``: a region of an emulated WAN)."""
        self.root, self.tls, self.port, self.host, self.prefix = root, tls, 0, host, tuple(prefix)
        if job is not None:
            init_job_dir(self.job_dir, job, run, sorted({host, *also, "127.0.0.1", "localhost"}), tls=tls)

    @property
    def job_dir(self) -> Path:
        return self.root / "job"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def ca(self) -> Path | None:
        return self.job_dir / "tls" / "ca.pem" if self.tls else None

    def token(self, identity: str) -> str:
        return token_for(self.job_dir, identity)

    def client(self, identity: str = "admin", token: str | None = None, http2: bool = True) -> SyncerClient:
        return SyncerClient(self.url, token if token is not None else self.token(identity), self.ca, http2=http2)

    def connector(self, kind: type[SyncerClient] = SyncerClient) -> Callable[[str], SyncerClient]:
        """Admin clients for any shard of this job by URL: the shards share the job directory's token and CA."""
        return lambda url: kind(url, self.token("admin"), self.ca)

    def start(self, *extra: str, timeout_s: float = 120.0) -> LocalSyncer:
        """Start (or restart) the service and return once it answers its health probe."""
        args = ["--job-dir", str(self.job_dir), "--bind", f"{self.host}:{self.port}", *extra]
        self.launch("ddctl_agents.service", [*args, *([] if self.tls else ["--plaintext"])], timeout_s)
        return self

    def __enter__(self) -> LocalSyncer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
