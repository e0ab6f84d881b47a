"""``ddctl bench syncer``: how fast the syncer merges M learners' int4 updates, on one core.

One round of one fragment, end to end through the core: decode M int4 wire
frames, validate them, token weights, RDA merge, outer Nesterov step. The
throughput is fp32 parameters of the fragment merged per second, in GB/s,
beside a memcpy of the same fragment in the same run. Both of the syncer's
paths run on the same frames: the fused one (updates stay packed, one native
pass per tensor: ``core/fused_round.py``) and the reference (decoded to fp32,
then merge.py and outer.py), which must publish the same values.

``shards`` runs that many independent syncer processes at once, each merging
its own fragment (what the shards of a sharded synchronizer do in normal
operation), and reports their aggregate throughput against one.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
from collections.abc import Sequence
from typing import Any

import torch

from ddctl_agents.core import _native
from ddctl_agents.core.admission import check_result, check_update
from ddctl_agents.core.config import SyncerConfig
from ddctl_agents.core.fragments import TensorSpec, fragment_tensors
from ddctl_agents.core.messages import Update, decode_update, encode_update
from ddctl_agents.core.packed import packable
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.errors import ConfigError


def _syncer(numel: int, tensors: int, learners: int) -> Synchronizer:
    per = numel // tensors
    params = {f"w{i}": torch.zeros(per) for i in range(tensors)}
    specs = [TensorSpec(name=n, shape=tuple(t.shape)) for n, t in params.items()]
    syncer = Synchronizer(params, fragment_tensors(specs, 1), frozenset(), SyncerConfig())
    for m in range(learners):
        syncer.register(0.0, f"L{m}")
    return syncer


def _frames(syncer: Synchronizer, learners: int) -> list[bytes]:
    g = torch.Generator().manual_seed(0)
    frames = []
    for m in range(learners):
        grads = {n: torch.randn(t.shape, generator=g) * 1e-3 for n, t in syncer.fragments[0].items()}
        update = Update(
            learner=f"L{m}", fragment=0, base_version=0, update_id="x", step=24, c_steps=24, c_tokens=1000 + m, tensors=grads
        )
        frames.append(encode_update(update, "int4", 64))
    return frames


def _one_round(syncer: Synchronizer, frames: Sequence[bytes | bytearray], r: int) -> tuple[float, float]:
    """Decode every frame, hand each update to the syncer, close the round: (decode seconds, the rest)."""
    start = time.perf_counter()
    decoded = [decode_update(frame)[0] for frame in frames]
    decoded_at = time.perf_counter()
    base = syncer.versions[0]
    for m, update in enumerate(decoded):
        syncer.receive(1.0, dataclasses.replace(update, base_version=base, update_id=f"{r}.{m}"))
    syncer.close_round(1.0, 0, "all_arrived", "bench")
    return decoded_at - start, time.perf_counter() - decoded_at


def _rounds(numel: int, tensors: int, learners: int, repeats: int, packed: bool) -> tuple[dict[str, float], Synchronizer]:
    """Best-of-``repeats`` (after one warm-up) round times on one path; the syncer after them."""
    syncer = _syncer(numel, tensors, learners)
    frames = [f if packed else bytearray(f) for f in _frames(syncer, learners)]  # a bytearray is decoded at once
    timed = [_one_round(syncer, frames, r) for r in range(repeats + 1)][1:]
    checks = []  # the trust boundary's share of a round: every update's admission, the result's check
    for _ in range(repeats):
        fresh = [decode_update(frame)[0] for frame in frames]  # a packed update measures itself once: not yet
        start = time.perf_counter()
        for update in fresh:
            check_update(update, syncer.fragments[0], syncer.limits)
        check_result(syncer.fragments[0], syncer.buffers[0], syncer.limits)
        checks.append(time.perf_counter() - start)
    decode, merge = min(timed, key=sum)  # the best round's own split, so decode + merge is that round
    times = {"round": decode + merge, "decode": decode, "merge": merge, "checks": min(checks)}
    return times, syncer


def _memcpy_seconds(numel: int, repeats: int) -> float:
    src = torch.randn(numel)
    dst = torch.empty_like(src)
    copies = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - start)
    return min(copies[1:])


def _largest_difference(a: Synchronizer, b: Synchronizer) -> float:
    return max(float((a.fragments[0][n] - b.fragments[0][n]).abs().max()) for n in a.fragments[0])


def measure_syncer(learners: int = 8, numel: int = 8 * 2**20, tensors: int = 8, repeats: int = 3) -> dict[str, Any]:
    """Best-of-``repeats`` round time for ``learners`` int4 updates of one ``numel``-parameter fragment, both paths."""
    if learners < 1 or numel < tensors or repeats < 1:
        raise ConfigError(f"need learners >= 1, numel >= tensors, repeats >= 1; got {learners}, {numel}, {repeats}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fused, fused_syncer = _rounds(numel, tensors, learners, repeats, packed=True)
        reference, reference_syncer = _rounds(numel, tensors, learners, repeats, packed=False)
        memcpy_s = _memcpy_seconds(numel, repeats)
    finally:
        torch.set_num_threads(threads)
    gb = numel * 4 / 1e9
    best = fused["round"]
    return {
        "learners": learners,
        "params": numel,
        "path": "fused" if packable("int4") else "reference (native kernels missing)",
        "int4_sums": _native.sums_path() if packable("int4") else "reference",
        "merge_gbps": round(gb / best, 6),
        "memcpy_gbps": round(gb / memcpy_s, 6),
        "ratio_to_memcpy": round(memcpy_s / best, 6),
        "round_seconds": round(best, 6),
        "decode_seconds": round(fused["decode"], 6),
        "merge_seconds": round(fused["merge"], 6),
        "per_learner_update_gbps": round(gb * learners / best, 6),
        "admission_seconds": round(fused["checks"], 6),
        "admission_share": round(fused["checks"] / best, 6),
        "reference": {
            "merge_gbps": round(gb / reference["round"], 6),
            "ratio_to_memcpy": round(memcpy_s / reference["round"], 6),
            "round_seconds": round(reference["round"], 6),
            "decode_seconds": round(reference["decode"], 6),
            "merge_seconds": round(reference["merge"], 6),
        },
        "fused_speedup": round(reference["round"] / best, 3),
        "largest_difference": _largest_difference(fused_syncer, reference_syncer),
        "threads": 1,
    }


def _shard_worker(numel: int, tensors: int, learners: int, rounds: int, barrier: Any, out: Any) -> None:
    """One shard's process: its own syncer and fragment, timed from a common start."""
    torch.set_num_threads(1)
    syncer = _syncer(numel, tensors, learners)
    frames = _frames(syncer, learners)
    _one_round(syncer, frames, -1)  # warm-up: first-touch page faults are not the steady state
    barrier.wait()
    start = time.perf_counter()
    for r in range(rounds):
        _one_round(syncer, frames, r)
    out.put((start, time.perf_counter()))


def measure_shard_scaling(
    shards: int, learners: int = 8, numel: int = 8 * 2**20, tensors: int = 8, rounds: int = 4
) -> dict[str, Any]:
    """Aggregate merge GB/s of 1..``shards`` syncer processes running at once, each on its own fragment."""
    if shards < 1 or rounds < 1:
        raise ConfigError(f"need shards >= 1 and rounds >= 1; got {shards}, {rounds}")
    context = multiprocessing.get_context("spawn")
    gb = numel * 4 / 1e9
    rows = []
    for k in range(1, shards + 1):
        barrier, out = context.Barrier(k), context.Queue()
        workers = [context.Process(target=_shard_worker, args=(numel, tensors, learners, rounds, barrier, out)) for _ in range(k)]
        for w in workers:
            w.start()
        spans = [out.get(timeout=600) for _ in workers]
        for w in workers:
            w.join()
        wall = max(end for _, end in spans) - min(start for start, _ in spans)
        rows.append({"shards": k, "aggregate_gbps": round(k * rounds * gb / wall, 6), "wall_seconds": round(wall, 6)})
    one = rows[0]["aggregate_gbps"]
    for row in rows:
        row["x_one_shard"] = round(row["aggregate_gbps"] / one, 3)
    return {"learners": learners, "params_per_shard": numel, "rounds": rounds, "shards": rows}
