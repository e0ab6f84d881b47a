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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddctl.credentials import init_job_dir, token_for
from ddctl_agents.agent.client import SyncerClient, Unavailable
from ddctl_agents.core.outer import OuterConfig
from ddctl_agents.core.quorum import QuorumConfig
from ddctl_agents.core.syncer import SyncerConfig
from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget
from ddctl_agents.train.job import JobConfig
from ddctl_agents.train.learner import SyncSettings

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def small_job(learners: int = 3, tokens: int = 150_000, fragments: int = 4, inner_steps: int = 8, quorum: int = 1) -> JobConfig:
    return JobConfig(
        inner=InnerConfig(preset="tiny", batch_size=8),
        data=DataConfig(max_bytes=1 << 21, eval_windows=16),
        budget=RunBudget(tokens=tokens, learners=learners),
        sync=SyncSettings(fragments=fragments, inner_steps=inner_steps),
        syncer=SyncerConfig(quorum=QuorumConfig(quorum=quorum), outer=OuterConfig(), inner_steps=inner_steps),
    )


@dataclass
class Job:
    """A job directory plus the processes running it."""

    root: Path
    tls: bool = True
    port: int = 0
    syncer: subprocess.Popen[bytes] | None = None
    learners: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    syncer_args: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, root: Path, job: JobConfig, tls: bool = True) -> Job:
        init_job_dir(root / "job", job, "test-run", ["127.0.0.1"], tls=tls)
        return cls(root=root, tls=tls)

    @property
    def job_dir(self) -> Path:
        return self.root / "job"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def token(self, identity: str) -> str:
        return token_for(self.job_dir, identity)

    def client(self, identity: str = "admin", token: str | None = None) -> SyncerClient:
        ca = self.job_dir / "tls" / "ca.pem" if self.tls else None
        return SyncerClient(self.url, token if token is not None else self.token(identity), ca)

    def start_syncer(self, *extra: str, wait: bool = True) -> None:
        port_file = self.root / "port"
        port_file.unlink(missing_ok=True)
        bind = f"127.0.0.1:{self.port}"
        args = ["--job-dir", str(self.job_dir), "--bind", bind, "--port-file", str(port_file), *extra]
        if not self.tls:
            args.append("--plaintext")
        with (self.root / "syncer.log").open("ab") as log:
            self.syncer = subprocess.Popen([sys.executable, "-m", "ddctl_agents.service", *args], stdout=log, stderr=log, env=ENV)
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            self._check_alive(self.syncer, "syncer")
            if time.monotonic() > deadline:
                raise TimeoutError("syncer did not bind")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        if wait:
            self.wait_healthy()

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        client = self.client()
        try:
            while True:
                assert self.syncer is not None
                self._check_alive(self.syncer, "syncer")
                try:
                    client.health()
                    return
                except Unavailable:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        finally:
            client.close()

    def start_learner(self, name: str, *extra: str, region: str = "") -> subprocess.Popen[bytes]:
        args = ["--syncer", self.url, "--name", name, "--token", self.token(name), "--summary", str(self.summary_path(name))]
        if self.tls:
            args += ["--ca", str(self.job_dir / "tls" / "ca.pem")]
        region_args = ["--region", region or f"region-{name}"]
        command = [sys.executable, "-m", "ddctl_agents.agent", *args, *region_args, *extra]
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
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status = self.status()
                if predicate(status):
                    return status
            except Unavailable:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}; logs in {self.root}")
            time.sleep(0.2)

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
        for proc in [*self.learners.values(), *([self.syncer] if self.syncer else [])]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)

    def _check_alive(self, proc: subprocess.Popen[bytes], name: str) -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}: {self.log(name)[-3000:]}")
