"""Codec throughput benchmark behind ``ddctl bench codec``.

Why: the learner encodes every outer gradient and the syncer decodes every
update, so a codec must keep up with memory bandwidth on one core, or it
steals time from training or stretches the sync window. Throughputs are
reported against ``memcpy`` (``dst.copy_(src)``) measured in the same run on
the same buffer, so numbers from different machines compare as ratios.

Run it small: ``python -c "from ddctl.bench.codec import measure_codecs as m; print(m(2**20))"``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from ddctl_agents.errors import ConfigError

#: Report order; the first entry is the one the paper ships (ALGORITHM.md §5).
BENCH_CODECS = ("int4", "int8", "bf16", "fp32", "int2", "int1")
SEED = 0


def measure_codecs(numel: int = 16 * 2**20, repeats: int = 5, block: int = 128) -> dict[str, Any]:
    """Encode/decode GB/s (of fp32 input, best of ``repeats``) and error for every codec, on one thread.

    Returns ``{"memcpy_gbps", "codecs": {name: {"encode_gbps", "decode_gbps",
    "rel_error"}}, "threads": 1, "native": bool}``; rel_error is
    ‖decode(encode(x)) − x‖₂ / ‖x‖₂ on a seeded Gaussian vector.
    """
    if numel < 1 or repeats < 1:
        raise ConfigError(f"numel and repeats must be positive, got {numel} and {repeats}")
    import torch  # lazy: keeps `ddctl --help` fast

    from ddctl_agents.core import codec

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(SEED))
        dst = torch.empty_like(x)
        memcpy_s = _best_seconds(lambda: dst.copy_(x), repeats)
        results = {}
        for name in BENCH_CODECS:
            payload = codec.encode(name, x, block)
            encode_s = _best_seconds(functools.partial(codec.encode, name, x, block), repeats)
            decode_s = _best_seconds(functools.partial(codec.decode, name, payload, numel, block), repeats)
            y = codec.decode(name, payload, numel, block)
            rel = (y.double() - x.double()).norm() / x.double().norm()
            results[name] = {
                "encode_gbps": _gbps(numel, encode_s),
                "decode_gbps": _gbps(numel, decode_s),
                "rel_error": float(rel),
            }
        return {
            "memcpy_gbps": _gbps(numel, memcpy_s),
            "codecs": results,
            "threads": 1,
            "native": codec.native_available(),
        }
    finally:
        torch.set_num_threads(threads)


def _best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of one warm-up plus ``repeats`` timed calls (best-of filters out noise)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _gbps(numel: int, seconds: float) -> float:
    """Throughput in GB/s of the fp32 input (numel * 4 bytes)."""
    return numel * 4 / max(seconds, 1e-12) / 1e9
