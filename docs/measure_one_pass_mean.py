"""The mean's merge and step in one pass against the two passes it replaced, paired in one run, on one core.

One 8,388,608-parameter fragment (8 tensors), M = 8 int4 updates kept packed, the weighted
mean (``--merge mean``, and every round's embeddings), momentum held. Each repeat times
``fused_outer_step`` (the mean formed and stepped in one native pass, never written) and
then the two passes it replaced (``packed_combine`` writes the mean, ``step_from`` steps
from it) on the same updates and state; the figure is the median of the repeats' ratios,
so the machine's drift cancels. Both must write the same bits, and the script checks it.
Then each native pass on one of the fragment's 1,048,576-parameter tensors, the passes
interleaved and the median of the repeats: a pass over the codes with one or two
combinations, written or not (the norms alone), and the step.

    .venv/bin/python docs/measure_one_pass_mean.py --repeats 21
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ddctl.bench.rounds import _frames, _syncer
from ddctl_agents.core import _native
from ddctl_agents.core.config import OuterConfig
from ddctl_agents.core.fused_round import fused_outer_step
from ddctl_agents.core.merge import Contribution
from ddctl_agents.core.messages import decode_update
from ddctl_agents.core.packed import PackedTensors


def _two_passes(params, buffers, packs, shares, config: OuterConfig, taken: int):  # type: ignore[no-untyped-def]
    """What the mean took before: the combination written into theta', then the step from it."""
    new_params, new_buffers = {}, {}
    momentum = (config.momentum, config.lr_at(taken), config.nesterov)
    for name, theta in params.items():
        tensors = [p[name] for p in packs]
        out = torch.empty_like(theta), torch.empty_like(theta)
        first = tensors[0]
        addresses = [t.scales for t in tensors], [t.codes for t in tensors]
        _native.packed_combine(first.codec, *addresses, [shares], first.numel, first.block, [out[0].data_ptr()])
        pointers = (out[0].data_ptr(), out[1].data_ptr())
        _native.step_from(out[0].data_ptr(), 1.0, theta.numel(), theta.data_ptr(), buffers[name].data_ptr(), momentum, pointers)
        new_params[name], new_buffers[name] = out
    return new_params, new_buffers


def _passes(packs, shares, theta: torch.Tensor, buf: torch.Tensor, repeats: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Median ms of each native pass over one tensor's 8 packed updates (interleaved, so drift hits all alike)."""
    tensors = [p["w0"] for p in packs]
    first, n = tensors[0], theta.numel()
    addresses = [t.scales for t in tensors], [t.codes for t in tensors]
    outs = [torch.empty(n), torch.empty(n)]
    written = [o.data_ptr() for o in outs]
    moves, step_out = (0.9, 0.7, True), (outs[0].data_ptr(), outs[1].data_ptr())
    runs = {
        "one_combination_norm_only": lambda: _native.packed_combine(first.codec, *addresses, [shares], n, first.block, []),
        "one_combination_written": lambda: _native.packed_combine(first.codec, *addresses, [shares], n, first.block, written[:1]),
        "two_combinations_norms_only": lambda: _native.packed_combine(first.codec, *addresses, [shares] * 2, n, first.block, []),
        "two_combinations_written": lambda: _native.packed_combine(
            first.codec, *addresses, [shares] * 2, n, first.block, written
        ),
        "step_from_written": lambda: _native.step_from(written[0], 1.0, n, theta.data_ptr(), buf.data_ptr(), moves, step_out),
        "one_combination_and_step_one_pass": lambda: _native.packed_combine_step(
            first.codec, addresses, shares, first.block, 1.0, (n, theta.data_ptr(), buf.data_ptr(), moves, step_out)
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return {f"{name}_ms": round(statistics.median(t) * 1e3, 3) for name, t in times.items()}


def main(repeats: int) -> None:
    torch.set_num_threads(1)
    syncer = _syncer(8 * 2**20, 8, 8)
    updates = [decode_update(frame)[0] for frame in _frames(syncer, 8)]
    contributions = [Contribution(learner=u.learner, tensors=u.tensors, c_steps=u.c_steps, c_tokens=u.c_tokens) for u in updates]
    packs = [u.tensors.packed for u in updates if isinstance(u.tensors, PackedTensors)]
    total = sum(c.weight for c in contributions)
    shares = [c.weight / total for c in sorted(contributions, key=lambda c: c.learner)]
    params = syncer.fragments[0]
    buffers = {name: torch.full_like(t, 1e-3) for name, t in params.items()}
    config = OuterConfig()
    one, two = [], []
    for r in range(repeats + 1):  # alternate which runs first: neither gains from the other's warm cache
        for first in (True, False) if r % 2 else (False, True):
            started = time.perf_counter()
            if first:
                fused = fused_outer_step(
                    params, buffers, contributions, embeddings=frozenset(), method="mean", config=config, taken=5
                )
            else:
                old = _two_passes(params, buffers, packs, shares, config, 5)
            (one if first else two).append(time.perf_counter() - started)
        assert fused is not None
        assert all(torch.equal(fused[k][n], old[k][n]) for k in (0, 1) for n in params), "the one pass wrote other bits"
    one, two = one[1:], two[1:]  # the first repeat touches fresh memory
    print(json.dumps({
        "one_pass_ms": round(statistics.median(one) * 1e3, 2),
        "two_passes_ms": round(statistics.median(two) * 1e3, 2),
        "median_ratio": round(statistics.median(a / b for a, b in zip(one, two, strict=True)), 3),
        "same_bits": True,
        "repeats": repeats,
        "per_tensor_passes": _passes(packs, shares, params["w0"], buffers["w0"], repeats),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    main(parser.parse_args().repeats)
