"""A round in which some learners sent two updates, on the fused path and on the reference path, in the same run.

One 8,388,608-parameter fragment (8 tensors), M = 8 learners with int4 updates, the
first ``--twice`` of them with two updates added for the round (``rounds.accumulate``),
RDA, momentum held; ``--repeats`` pairs, each timing one path then the other. Until the fused path took a learner's
added updates packed, such a round ran the reference path: the reference's time is
what it cost. Run from the repository:

    .venv/bin/python docs/measure_summed_round.py [--twice 4] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from ddctl.bench.rounds import _frames, _syncer
from ddctl_agents.core.config import OuterConfig
from ddctl_agents.core.fused_round import fused_outer_step
from ddctl_agents.core.merge import Contribution, merge_fragment
from ddctl_agents.core.messages import decode_update
from ddctl_agents.core.outer import outer_step
from ddctl_agents.core.rounds import accumulate


def _contributions(frames: list[bytes], twice: int, packed: bool) -> list[Contribution]:
    """Learner m's update; learners below ``twice`` add learner (m + 1)'s frame as their second update."""
    out = []
    for m, frame in enumerate(frames):
        total = None
        for source in [frame, frames[(m + 1) % len(frames)]][: 2 if m < twice else 1]:
            u = decode_update(source if packed else bytearray(source))[0]
            c = Contribution(learner=f"L{m}", tensors=u.tensors, c_steps=u.c_steps, c_tokens=u.c_tokens)
            total = accumulate(total, c)
        assert total is not None
        out.append(total)
    return out


def _paired(first: Callable[[], object], second: Callable[[], object], repeats: int) -> tuple[float, float, float]:
    """Each repeat times one then the other, so both see the same machine (it is shared and its speed drifts for
    seconds at a time): (best of the first, best of the second, median of the pairs' ratios second / first)."""
    pairs = []
    for _ in range(repeats + 1):
        times = []
        for run in (first, second):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        pairs.append(times)
    pairs = pairs[1:]
    return min(a for a, _ in pairs), min(b for _, b in pairs), statistics.median(b / a for a, b in pairs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--twice", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    syncer = _syncer(8 * 2**20, 8, 8)
    frames = _frames(syncer, 8)
    params = syncer.fragments[0]
    buffers = {name: torch.full_like(t, 1e-3) for name, t in params.items()}
    config = OuterConfig()

    def fused() -> object:
        cs = _contributions(frames, args.twice, packed=True)
        return fused_outer_step(params, buffers, cs, embeddings=frozenset(), method="rda", config=config, taken=5)

    def reference() -> object:
        cs = _contributions(frames, args.twice, packed=False)
        return outer_step(params, merge_fragment(cs, frozenset(), "rda"), buffers, config, 5)

    assert fused() is not None
    f, r, ratio = _paired(fused, reference, args.repeats)
    figures = {"fused_s": round(f, 4), "reference_s": round(r, 4), "speedup_median": round(ratio, 2)}
    print(json.dumps({"twice": args.twice, **figures}))


if __name__ == "__main__":
    main()
