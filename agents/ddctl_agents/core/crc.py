"""CRC-32 of frames and log records: ``zlib.crc32``'s value, faster on large inputs.

Why: every update frame is checksummed by its learner and again by the syncer, and every
log record once more; at zlib's ~3.7 GB/s that was a quarter of the syncer's round on a
large fragment. The native kernel (``native/crc32.c``, PCLMULQDQ folding) gives the same
value on every input; below ``NATIVE_FROM`` bytes, or without the kernels, zlib does it.
"""

from __future__ import annotations

import zlib

import numpy as np

from ddctl_agents.core import _native

NATIVE_FROM = 1 << 16
"""Inputs shorter than this stay with zlib: a ctypes call costs more than it saves there."""


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """``zlib.crc32(data, value)``."""
    view = memoryview(data)
    if view.nbytes < NATIVE_FROM or _native.kernels() is None:
        return zlib.crc32(view, value)
    flat = np.frombuffer(view, dtype=np.uint8)
    return _native.crc32(int(flat.ctypes.data), flat.size, value)
