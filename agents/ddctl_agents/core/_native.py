"""ctypes binding to the optional native int8/int4 kernels (``ddctl_agents._kernels``).

Why ctypes and not a CPython method table: the kernels stay plain C functions
on raw pointers (``tensor.data_ptr()``), ctypes releases the GIL around each
call, and the same ``.so`` can be inspected or benchmarked from C.

Setting ``DDCTL_NO_NATIVE=1`` forces the torch reference path (read on every
call, so tests can flip it); the reference produces the same bytes.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

NO_NATIVE_ENV = "DDCTL_NO_NATIVE"
NATIVE_CODECS = ("int8", "int4")

_ENCODE_ARGS = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
_DECODE_ARGS = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
_CODEC_BITS = {"int8": 8, "int4": 4}
_P, _I64, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    # native/fused.c: the syncer's round on packed updates
    "ddctl_q_stats": ([ctypes.c_int, _P, _P, _I64, _I64, _P], None),
    "ddctl_q_combine": ([ctypes.c_int, ctypes.c_int, _I64, _P, _P, _P, _I64, _I64, _P, _P], None),
    "ddctl_step_from": ([_P, _F, _I64, _P, _P, _F, _F, ctypes.c_int, _P, _P, _P], None),
    "ddctl_q_combine_step": ([ctypes.c_int, _I64, _P, _P, _P, _I64, _I64, _F, _P, _P, _F, _F, ctypes.c_int, _P, _P, _P], None),
    "ddctl_use_avx512": ([ctypes.c_int], ctypes.c_int),
    "ddctl_sums_path": ([], ctypes.c_int),
    # native/crc32.c
    "ddctl_crc32": ([ctypes.c_uint32, _P, ctypes.c_size_t], ctypes.c_uint32),
}


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    """Load the extension once; returns (library, why it is missing)."""
    try:
        from ddctl_agents import _kernels  # type: ignore[attr-defined]
    except ImportError as exc:
        return None, f"ddctl_agents._kernels is not importable ({exc})"
    lib = ctypes.CDLL(_kernels.__file__)
    for codec in NATIVE_CODECS:
        enc = getattr(lib, f"ddctl_{codec}_encode")
        enc.argtypes, enc.restype = _ENCODE_ARGS, ctypes.c_int
        dec = getattr(lib, f"ddctl_{codec}_decode")
        dec.argtypes, dec.restype = _DECODE_ARGS, None
    for name, (args, result) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib, ""


def disabled() -> bool:
    """True when the environment asks for the reference path."""
    return os.environ.get(NO_NATIVE_ENV, "").strip() not in ("", "0")


def kernels() -> ctypes.CDLL | None:
    """The loaded library, or None when it is missing or disabled."""
    return None if disabled() else _load()[0]


def missing_reason() -> str:
    """Why the native kernels are not in use ('' when they are)."""
    if disabled():
        return f"disabled by {NO_NATIVE_ENV}"
    return _load()[1]


def encode_into(codec: str, src: int, numel: int, block: int, scales: int, codes: int) -> bool:
    """Run the native encoder on raw pointers; False means the input held NaN/Inf."""
    lib = kernels()
    assert lib is not None and codec in NATIVE_CODECS
    status: int = getattr(lib, f"ddctl_{codec}_encode")(src, numel, block, scales, codes)
    return status == 0


def decode_into(codec: str, scales: int, codes: int, numel: int, block: int, dst: int) -> None:
    """Run the native decoder on raw pointers (sizes already validated by the caller)."""
    lib = kernels()
    assert lib is not None and codec in NATIVE_CODECS
    getattr(lib, f"ddctl_{codec}_decode")(scales, codes, numel, block, dst)


def _library() -> ctypes.CDLL:
    lib = kernels()
    assert lib is not None, "callers check kernels() first"
    return lib


def _pointers(values: list[int]) -> ctypes.Array[ctypes.c_void_p]:
    return (ctypes.c_void_p * len(values))(*values)


def _floats(values: list[float]) -> ctypes.Array[ctypes.c_float]:
    return (ctypes.c_float * len(values))(*values)


def packed_stats(codec: str, scales: int, codes: int, numel: int, block: int) -> tuple[float, float]:
    """(sum of squares, max |value|) of one packed tensor, without decoding it; NaN when a scale is not finite."""
    out = (ctypes.c_double * 2)()
    _library().ddctl_q_stats(_CODEC_BITS[codec], scales, codes, numel, block, out)
    return out[0], out[1]


def packed_combine(
    codec: str, scales: list[int], codes: list[int], coefficients: list[list[float]], numel: int, block: int, out: list[int]
) -> list[float]:
    """out[k] = sum_m coefficients[k][m] v_m over packed tensors v_m (k < 2), decoding each once; their squared norms.

    ``out`` empty: the norms only, nothing written."""
    count = len(coefficients)
    assert 1 <= count <= 2 and len(out) in (0, count) and all(len(c) == len(codes) for c in coefficients)
    norms = (ctypes.c_double * count)()
    fn = _library().ddctl_q_combine
    flat = _floats([x for row in coefficients for x in row])
    outs = _pointers(out) if out else None
    fn(_CODEC_BITS[codec], count, len(codes), _pointers(scales), _pointers(codes), flat, numel, block, outs, norms)
    return list(norms)


def step_from(
    delta: int, scale: float, numel: int, theta: int, buf: int | None, momentum: tuple[float, float, bool], out: tuple[int, int]
) -> tuple[float, float]:
    """The outer step with delta = ``scale`` * the float32 values at ``delta`` (which may be one of ``out``); the
    largest |value| it wrote to each of ``out`` (NaN if it wrote a NaN), for the result's check.

    ``momentum`` is (mu, lr, nesterov); ``buf`` None starts the momentum at delta."""
    mu, lr, nesterov = momentum
    largest = (ctypes.c_float * 2)()
    _library().ddctl_step_from(delta, scale, numel, theta, buf, mu, lr, int(nesterov), out[0], out[1], largest)
    return largest[0], largest[1]


def packed_combine_step(
    codec: str,
    packed: tuple[list[int], list[int]],
    coefficients: list[float],
    block: int,
    scale: float,
    step: tuple[int, int, int | None, tuple[float, float, bool], tuple[int, int]],
) -> tuple[float, float]:
    """``packed_combine`` of one combination, then ``step_from`` with delta = ``scale`` * it, in one pass that never
    writes the combination: the same values. ``packed`` is (scales, codes) of the updates; ``step`` is (numel, theta,
    buf, momentum, out) as ``step_from`` takes them."""
    scales, codes = packed
    numel, theta, buf, (mu, lr, nesterov), out = step
    assert len(coefficients) == len(codes) == len(scales)
    largest = (ctypes.c_float * 2)()
    _library().ddctl_q_combine_step(
        _CODEC_BITS[codec], len(codes), _pointers(scales), _pointers(codes), _floats(coefficients), numel, block, scale,
        theta, buf, mu, lr, int(nesterov), out[0], out[1], largest,
    )  # fmt: skip
    return largest[0], largest[1]


def use_avx512(allowed: bool) -> bool | None:
    """Let the int4 combinations use AVX-512 where the CPU has it (the default), or keep them on AVX2, so the two
    paths can be compared on one machine; the previous setting, or None where the CPU has no AVX-512F."""
    before: int = _library().ddctl_use_avx512(int(allowed))
    return None if before < 0 else bool(before)


def sums_path() -> str:
    """What the int4 combinations' sums run on now (``avx512``, ``avx2`` or ``portable``), for a benchmark to say."""
    path: int = _library().ddctl_sums_path()
    return ("portable", "avx2", "avx512")[path]


def crc32(address: int, nbytes: int, value: int) -> int:
    """zlib.crc32 of ``nbytes`` at ``address``, continuing from ``value`` (native/crc32.c)."""
    result: int = _library().ddctl_crc32(value, address, nbytes)
    return result
