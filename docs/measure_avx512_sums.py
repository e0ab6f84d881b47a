"""The syncer's round with its int4 sums on AVX-512 against the same round on AVX2, paired in one run, on one core.

``ddctl bench syncer``'s round: one 8,388,608-parameter fragment (8 tensors), M = 8 int4
updates kept packed, RDA's two combinations, the outer step. Two synchronizers take the same
rounds of the same frames, one with the sums on AVX-512 (``_native.use_avx512(True)``, the
default where the CPU has AVX-512F) and one on AVX2; each repeat times one round of each,
alternating which goes first, and the figure is the median of the repeats' ratios, so the
machine's drift cancels. Both must publish the same bits, and the script checks it. Then the
combination pass alone on one 1,048,576-parameter tensor, both ways, interleaved.

    .venv/bin/python docs/measure_avx512_sums.py --repeats 21
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable

import torch

from ddctl.bench.rounds import _frames, _one_round, _syncer
from ddctl_agents.core import _native
from ddctl_agents.core.messages import decode_update
from ddctl_agents.core.packed import PackedTensors


def _timed(wide: bool, run: Callable[[], object]) -> float:
    _native.use_avx512(wide)
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _pass(frames: list[bytes], repeats: int) -> dict[str, float]:
    """Median ms of RDA's combination pass (two combinations, written) over one tensor, both ways, interleaved."""
    packs = [u.tensors.packed["w0"] for u in (decode_update(f)[0] for f in frames) if isinstance(u.tensors, PackedTensors)]
    first, n = packs[0], packs[0].numel
    addresses = [p.scales for p in packs], [p.codes for p in packs]
    rows = [[1 / len(packs)] * len(packs), [0.3] * len(packs)]
    outs = [torch.empty(n), torch.empty(n)]
    written = [o.data_ptr() for o in outs]

    def combine() -> object:
        return _native.packed_combine(first.codec, *addresses, rows, n, first.block, written)

    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(repeats):
        for wide in (True, False) if r % 2 else (False, True):
            times[wide].append(_timed(wide, combine))
    return {f"combination_pass_{'avx512' if w else 'avx2'}_ms": round(statistics.median(t) * 1e3, 3) for w, t in times.items()}


def main(repeats: int) -> None:
    torch.set_num_threads(1)
    if _native.use_avx512(True) is None:
        raise SystemExit("this CPU has no AVX-512F: there is nothing to compare")
    syncers = {True: _syncer(8 * 2**20, 8, 8), False: _syncer(8 * 2**20, 8, 8)}
    frames = _frames(syncers[True], 8)
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(repeats + 1):  # alternate which runs first: neither gains from the other's warm cache
        for wide in (True, False) if r % 2 else (False, True):
            times[wide].append(_timed(wide, functools.partial(_one_round, syncers[wide], frames, r)))
    _native.use_avx512(True)
    wide, narrow = syncers[True], syncers[False]
    same = all(torch.equal(wide.fragments[0][n], narrow.fragments[0][n]) for n in wide.fragments[0])
    same = same and all(torch.equal(wide.buffers[0][n], narrow.buffers[0][n]) for n in wide.buffers[0])
    assert same and wide.versions == narrow.versions, "the two paths published other bits"
    pairs = list(zip(times[True][1:], times[False][1:], strict=True))  # the first repeat touches fresh memory
    print(json.dumps({
        "round_avx512_ms": round(statistics.median(a for a, _ in pairs) * 1e3, 2),
        "round_avx2_ms": round(statistics.median(b for _, b in pairs) * 1e3, 2),
        "median_ratio": round(statistics.median(a / b for a, b in pairs), 3),
        "same_bits": same,
        "rounds": repeats + 1,
        "per_tensor": _pass(frames, repeats),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    main(parser.parse_args().repeats)
