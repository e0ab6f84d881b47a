"""Does a round pay for fresh memory? ``ddctl bench syncer``'s round with its new tensors fresh, against the same
round writing into a pool of reused ones, paired in one run on one core.

Each repeat runs a round of each kind on the same frames (8 int4 updates of an 8,388,608-parameter fragment,
RDA), alternating which goes first; the pooled kind patches ``torch.empty_like`` in ``core/fused_round.py`` to
hand out tensors from a pool big enough that no tensor a syncer still holds is written. The figure is the median
of the repeats' ratios (pooled / fresh).

    .venv/bin/python docs/measure_round_memory.py --repeats 15
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import types
from unittest import mock

import torch

from ddctl.bench.rounds import _frames, _one_round, _syncer
from ddctl_agents.core import fused_round


class _Pool:
    """``empty_like`` from a ring of tensors: the 64 outputs of four rounds (8 tensors, theta' and buf' each)."""

    def __init__(self, size: int = 64) -> None:
        self.ring: list[torch.Tensor] = []
        self.turn = itertools.cycle(range(size))
        self.size = size

    def empty_like(self, like: torch.Tensor) -> torch.Tensor:
        i = next(self.turn)
        if len(self.ring) < self.size:
            self.ring.append(torch.empty_like(like))
        return self.ring[i]


def main(repeats: int) -> None:
    torch.set_num_threads(1)
    fresh, pooled = _syncer(8 * 2**20, 8, 8), _syncer(8 * 2**20, 8, 8)
    frames = _frames(fresh, 8)
    pool = _Pool()
    proxy = types.SimpleNamespace(**{**vars(torch), "empty_like": pool.empty_like})  # torch, but for empty_like
    patched = mock.patch.object(fused_round, "torch", proxy)
    times: dict[str, list[float]] = {"fresh": [], "pooled": []}
    for r in range(repeats + 2):  # two warm-up rounds each
        for kind in ("fresh", "pooled") if r % 2 else ("pooled", "fresh"):
            if kind == "pooled":
                with patched:
                    decode, merge = _one_round(pooled, frames, r)
            else:
                decode, merge = _one_round(fresh, frames, r)
            times[kind].append(decode + merge)
    fresh_s, pooled_s = times["fresh"][2:], times["pooled"][2:]
    same = all(torch.equal(fresh.fragments[0][n], pooled.fragments[0][n]) for n in fresh.fragments[0])
    print(json.dumps({
        "fresh_round_ms": round(statistics.median(fresh_s) * 1e3, 2),
        "pooled_round_ms": round(statistics.median(pooled_s) * 1e3, 2),
        "median_ratio": round(statistics.median(p / f for p, f in zip(pooled_s, fresh_s, strict=True)), 3),
        "same_fragment": same,
        "repeats": repeats,
    }))  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    main(parser.parse_args().repeats)
