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

NO_NATIVE_ENV = "DDCTL_NO_NATIVE"
NATIVE_CODECS = ("int8", "int4")

_ENCODE_ARGS = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
_DECODE_ARGS = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]


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
