"""Shards of one job on loopback, for the sharded synchronizer's tests: real processes over HTTP/2 with TLS."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.local.service import LocalSyncer
from ddctl_agents.core import shardmap
from ddctl_agents.core.messages import Update, encode_update
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.waiting import wait_until
from tests.service_harness import ENV, small_job

SHARDS = 2
FRAGMENTS = 4


def start_shards(root: Path, tokens: int = 120_000) -> list[LocalSyncer]:
    """Two shards of one job: one job directory (secret, CA, job.json, shards.json), a state directory each."""
    job = small_job(learners=2, tokens=tokens, fragments=FRAGMENTS, inner_steps=8)
    first = LocalSyncer(root / "S0", job, run="sharded")
    (root / "S0" / "job" / "shards.json").write_text(json.dumps(shardmap.round_robin(SHARDS, FRAGMENTS).to_json()))
    started = [first]
    for i in range(1, SHARDS):
        (root / f"S{i}").mkdir()
        (root / f"S{i}" / "job").symlink_to(first.job_dir)
        started.append(LocalSyncer(root / f"S{i}"))
    for i, shard in enumerate(started):
        shard_map = first.job_dir / "shards.json"
        shard.start("--shard-map", str(shard_map), "--shard", f"S{i}", "--state-dir", str(shard.root / "state"), "--linger", "60")
    return started


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[list[LocalSyncer]]:
    started = start_shards(tmp_path)
    yield started
    for shard in started:
        shard.kill()


@pytest.fixture
def longer_shards(tmp_path: Path) -> Iterator[list[LocalSyncer]]:
    started = start_shards(tmp_path, tokens=300_000)
    yield started
    for shard in started:
        shard.kill()


def start_learner(root: Path, shards: list[LocalSyncer], name: str) -> subprocess.Popen[bytes]:
    urls = [arg for shard in reversed(shards) for arg in ("--syncer", shard.url)]  # any order: each shard says who it is
    job_dir = shards[0].job_dir
    args = [*urls, "--name", name, "--token", shards[0].token(name), "--ca", str(job_dir / "tls" / "ca.pem")]
    args += ["--summary", str(root / f"{name}.summary.json"), "--region", f"region-{name}"]
    with (root / f"{name}.log").open("ab") as log:
        return subprocess.Popen([sys.executable, "-m", "ddctl_agents.agent", *args], stdout=log, stderr=log, env=ENV)


def status(shard: LocalSyncer) -> dict[str, Any]:
    client = shard.client()
    try:
        return client.status()
    finally:
        client.close()


def restart(shard: LocalSyncer, name: str) -> None:
    """Start a killed shard again with its own state directory (what recovery reads)."""
    shard.start("--shard-map", str(shard.job_dir / "shards.json"), "--shard", name, "--state-dir", str(shard.root / "state"),
                "--linger", "60")  # fmt: skip


def wait_learners(root: Path, learners: dict[str, subprocess.Popen[bytes]], timeout_s: float = 300.0) -> None:
    """Every learner exits 0 (its log's tail in the failure otherwise)."""
    for name, proc in learners.items():
        code = proc.wait(timeout=timeout_s)
        assert code == 0, f"learner {name} exited {code}: {(root / f'{name}.log').read_text()[-3000:]}"


def kill_left(learners: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in learners.values():
        if proc.poll() is None:
            proc.kill()


def wait_finished(shards: list[LocalSyncer]) -> list[dict[str, Any]]:
    """Each shard's status once its job has finished."""
    return [
        wait_until(lambda s=s: (st := status(s))["job"]["phase"] == "finished" and st, timeout_s=120, what="a shard to finish")
        for s in shards
    ]


def update_frame(assembly: Assembly, fragment: int, number: int, clock: dict[str, int] | None = None) -> bytes:
    """L0's (incarnation 1) update number ``number`` of ``fragment`` from version 0, as a learner sends it (int4)."""
    tensors = {s.name: torch.full(s.shape, 1e-3) for s in assembly.fragmentation.fragments[fragment]}
    update = Update(learner="L0", fragment=fragment, base_version=0, update_id=f"L0.1.{number}", step=8, c_steps=8,
                    c_tokens=8192, tensors=tensors, vclock=clock or {}, incarnation=1)  # fmt: skip
    return encode_update(update, "int4", 64)


def replays_bit_for_bit(shards: list[LocalSyncer]) -> None:
    """``ddctl replay`` of the shards' tapes, given in any order: fresh learners and shard cores reproduce every
    shard's fragments bit for bit (each tape ends with the hash of its own)."""
    tapes = [str(s.root / "state" / "tape.jsonl") for s in reversed(shards)]
    result = CliRunner().invoke(app, ["replay", *tapes, "--json"])
    assert result.exit_code == 0, result.output
    replayed = json.loads(result.stdout)
    assert replayed["match"] and replayed["service"] and replayed["shards"] == SHARDS and replayed["lost_updates"] == 0
    assert replayed["recorded_sha256"] is None  # no tape holds the whole model: each shard's part is compared
