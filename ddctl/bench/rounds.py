"""``ddctl bench syncer``: how fast the syncer merges M learners' int4 updates, on one core.

One round of one fragment, end to end through the core: decode M int4 wire
frames, validate them, token weights, RDA merge, outer Nesterov step. The
throughput is fp32 parameters of the fragment merged per second, in GB/s,
beside a memcpy of the same fragment in the same run.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from ddctl_agents.core.admission import check_result, check_update
from ddctl_agents.core.config import SyncerConfig
from ddctl_agents.core.fragments import TensorSpec, fragment_tensors
from ddctl_agents.core.messages import Update, decode_update, encode_update
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.errors import ConfigError


def _syncer(numel: int, tensors: int) -> Synchronizer:
    per = numel // tensors
    params = {f"w{i}": torch.zeros(per) for i in range(tensors)}
    specs = [TensorSpec(name=n, shape=tuple(t.shape)) for n, t in params.items()]
    return Synchronizer(params, fragment_tensors(specs, 1), frozenset(), SyncerConfig())


def measure_syncer(learners: int = 8, numel: int = 8 * 2**20, tensors: int = 8, repeats: int = 3) -> dict[str, Any]:
    """Best-of-``repeats`` round time for ``learners`` int4 updates of one ``numel``-parameter fragment."""
    if learners < 1 or numel < tensors or repeats < 1:
        raise ConfigError(f"need learners >= 1, numel >= tensors, repeats >= 1; got {learners}, {numel}, {repeats}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        syncer = _syncer(numel, tensors)
        names = [f"L{i}" for i in range(learners)]
        for name in names:
            syncer.register(0.0, name)
        g = torch.Generator().manual_seed(0)
        frames = []
        for m, name in enumerate(names):
            grads = {n: torch.randn(t.shape, generator=g) * 1e-3 for n, t in syncer.fragments[0].items()}
            update = Update(
                learner=name, fragment=0, base_version=0, update_id="x", step=24, c_steps=24, c_tokens=1000 + m, tensors=grads
            )
            frames.append((name, update, encode_update(update, "int4", 64)))
        decode_s, merge_s, total_s = [], [], []
        for r in range(repeats + 1):
            start = time.perf_counter()
            decoded = [decode_update(frame)[0] for _, _, frame in frames]
            decoded_at = time.perf_counter()
            base = syncer.versions[0]
            for m, update in enumerate(decoded):
                syncer.receive(1.0, dataclasses.replace(update, base_version=base, update_id=f"{r}.{m}"))
            syncer.close_round(1.0, 0, "all_arrived", "bench")
            end = time.perf_counter()
            if r > 0:
                decode_s.append(decoded_at - start)
                merge_s.append(end - decoded_at)
                total_s.append(end - start)
        checks = []  # the trust boundary's share of a round: every update's admission, the result's check
        for _ in range(repeats):
            start = time.perf_counter()
            for update in decoded:
                check_update(update, syncer.fragments[0], syncer.limits)
            check_result(syncer.fragments[0], syncer.buffers[0], syncer.limits)
            checks.append(time.perf_counter() - start)
        src = torch.randn(numel)
        dst = torch.empty_like(src)
        copies = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            dst.copy_(src)
            copies.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    gb = numel * 4 / 1e9
    best = min(total_s)
    memcpy = gb / min(copies[1:])
    return {
        "learners": learners,
        "params": numel,
        "merge_gbps": round(gb / best, 3),
        "memcpy_gbps": round(memcpy, 3),
        "ratio_to_memcpy": round(gb / best / memcpy, 4),
        "round_seconds": round(best, 4),
        "decode_seconds": round(min(decode_s), 4),
        "merge_seconds": round(min(merge_s), 4),
        "per_learner_update_gbps": round(gb * learners / best, 3),
        "admission_seconds": round(min(checks), 4),
        "admission_share": round(min(checks) / best, 4),
        "threads": 1,
    }
