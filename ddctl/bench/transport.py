"""``ddctl bench transport``: one large update upload over HTTP/2 and over HTTP/1.1, same run.

Both protocols push the same valid outer-gradient frame (fp32, so one fragment
of the ``base`` preset is about 64 MiB) to a real syncer process on loopback,
through the learner's own client, TLS with the job's CA included. Each timing
covers the whole acknowledged upload: transfer, decode, validation and the
fsync that makes it durable, identical for both protocols; the next upload
starts once the round it opened has merged, so merge CPU never overlaps a
timing. The two protocols alternate so drift on a noisy machine hits both
alike, and the headline figures are medians (best-of figures come beside).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ddctl.config.job import build_job
from ddctl.local.service import LocalSyncer
from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.core.messages import Update, decode_fragment, encode_update
from ddctl_agents.errors import ConfigError
from ddctl_agents.train.job import JobConfig
from ddctl_agents.waiting import wait_until

PROTOCOLS = ("h2", "h1")


def transport_job(preset: str, fragments: int) -> JobConfig:
    """One learner's worth of job for timing uploads: a model of ``preset``, little data, H = 8."""
    knobs = {"preset": preset, "batch_size": 1, "max_bytes": 1 << 20, "eval_windows": 4, "tokens": 1 << 20, "learners": 1}
    return build_job({**knobs, "fragments": fragments, "inner_steps": 8})


def _wait_for_merge(client: SyncerClient, url: str, base: int, timeout_s: float = 60.0) -> None:
    """Let the round the upload opened close before the next timing, so that merge never overlaps it."""
    wait_until(
        lambda: int(client.http.get(f"{url}/v1/vclock").json()["versions"][0]) > base,
        timeout_s=timeout_s,
        every_s=0.02,
        what="the benchmark round to close",
        error=ConfigError,
    )


def measure_transport(repeats: int = 5, preset: str = "base", fragments: int = 8, tls: bool = True) -> dict[str, Any]:
    """Megabits/s of acknowledged uploads per protocol; ``ratio`` is h2 over h1 (medians of ``repeats``)."""
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    with (
        tempfile.TemporaryDirectory(prefix="ddctl-bench-") as tmp,
        LocalSyncer(Path(tmp), transport_job(preset, fragments), tls=tls) as syncer,
    ):
        syncer.start("--snapshot-every", "3600")
        learner = syncer.client("L0")
        learner.register("L0", 1, "bench")
        shapes = decode_fragment(learner.http.get(f"{syncer.url}/v1/fragments/0").content)[0].tensors
        tensors = {name: torch.full_like(t.float(), 1e-4) for name, t in shapes.items()}
        learner.close()
        seconds: dict[str, list[float]] = {p: [] for p in PROTOCOLS}
        clients = {p: syncer.client("L0", http2=p == "h2") for p in PROTOCOLS}
        size = 0
        try:
            for i in range(repeats + 1):  # the first round is a warm-up
                for protocol in PROTOCOLS:
                    client = clients[protocol]
                    base = int(client.http.get(f"{syncer.url}/v1/vclock").json()["versions"][0])
                    update = Update(
                        learner="L0",
                        fragment=0,
                        base_version=base,
                        update_id=f"L0.1.{protocol}.{i}",
                        step=8,
                        c_steps=8,
                        c_tokens=8,
                        tensors=tensors,
                    )
                    frame = encode_update(update, "fp32", 64)
                    size = len(frame)
                    started = time.perf_counter()
                    ack = client.push(frame, 0)
                    elapsed = time.perf_counter() - started
                    if ack["status"] not in ("accepted", "late"):
                        raise ConfigError(f"the syncer did not take the benchmark update: {ack}")
                    _wait_for_merge(client, syncer.url, base)
                    if i > 0:
                        seconds[protocol].append(elapsed)
            versions = {p: c.http.get(f"{syncer.url}/healthz").http_version for p, c in clients.items()}
        finally:
            for client in clients.values():
                client.close()
    best = {p: size * 8 / min(s) / 1e6 for p, s in seconds.items()}
    median = {p: size * 8 / statistics.median(s) / 1e6 for p, s in seconds.items()}
    return {
        "h2_mbps": round(median["h2"], 1),
        "h1_mbps": round(median["h1"], 1),
        "ratio": round(median["h2"] / median["h1"], 3),
        "best_h2_mbps": round(best["h2"], 1),
        "best_h1_mbps": round(best["h1"], 1),
        "best_ratio": round(best["h2"] / best["h1"], 3),
        "payload_bytes": size,
        "repeats": repeats,
        "tls": tls,
        "negotiated": versions,
        "seconds": {p: [round(x, 4) for x in s] for p, s in seconds.items()},
    }
