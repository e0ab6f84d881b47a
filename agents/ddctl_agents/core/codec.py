"""Outer-gradient codecs: the wire format learners use to send Δ_p (ALGORITHM.md §5).

Pure and deterministic: bytes in, tensors out, no I/O. The same input gives the
same bytes with or without the native kernels (``native_available()``); the
torch reference in ``_codec_ref`` defines the format, the C kernels in
``ddctl_agents/native/kernels.c`` make int8/int4 fast.

Wire contract (every multi-byte number little-endian; ``n`` values, blocks of
``block`` values, the last block partial when ``n % block``; ``nb = ceil(n/block)``):

- ``fp32``: the n float32 values. Lossless.
- ``bf16``: the n values as bfloat16, round to nearest even (torch's
  ``.to(torch.bfloat16)``). Finite values above bf16's maximum become ±Inf.
- ``int8``: nb float32 scales, then n int8 codes. Per block:
  ``scale = absmax / 127``; ``inv = 1 / scale``, or 0 when that is not finite
  (an all-zero block, or absmax below ~2^-120); ``q = clamp(round_half_even(x * inv), -127, 127)``.
  Every step is one float32 operation. Decode: ``float(q) * scale``.
- ``int4``: nb float32 scales, then ceil(n/2) bytes. As int8 with 7 in place of
  127; each q is a 4-bit two's complement nibble. Element 2i is the LOW nibble
  of byte i and element 2i+1 the HIGH nibble; an odd n leaves a zero high
  nibble in the last byte. Example: values (1, -1, 7) with scale 1 pack to
  bytes ``0xF1 0x07``. Nibble 0x8 (-8) is never written; decoders read it as -8.
- ``int2``: nb float32 scales, then ceil(n/4) bytes. ``scale = absmax / 1.5``;
  code c in 0..3 stands for ``(c - 1.5) * scale``; nearest level, ties upward:
  ``c = clamp(floor(x * inv + 2), 0, 3)`` with inv as for int8. Element 4i+j
  sits at bits 2j..2j+1 of byte i; unused trailing bits are zero.
- ``int1``: nb float32 scales, then ceil(n/8) bytes. ``scale = mean(|x|)`` of the
  block (summed in float64, rounded once to float32); bit 1 means negative (so 0 and -0 decode to +scale); decode is
  ``±scale``. Element 8i+j sits at bit j of byte i; unused trailing bits are zero.

Blocks whose absmax is within a few ulps of float32's maximum (~3.4e38) may
decode their extreme values to ±Inf; real outer gradients are far below that.

``block`` must be a multiple of 8 in [8, 4096] so that blocks never share a
byte except at the very end. Sizes are exact and checked: callers validate an
untrusted length with ``encoded_nbytes`` before allocating anything.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ddctl_agents.core import _codec_ref, _native
from ddctl_agents.core.choices import CODECS, DEFAULT_BLOCK, MAX_BLOCK, MIN_BLOCK, block_ok
from ddctl_agents.errors import CodecError

__all__ = [
    "CODECS",
    "DEFAULT_BLOCK",
    "CodecError",
    "decode",
    "encode",
    "encoded_nbytes",
    "native_available",
    "roundtrip",
]

_ELEMENT_BYTES = {"fp32": 4, "bf16": 2}


def native_available() -> bool:
    """True when int8/int4 run in the native kernels (not disabled by DDCTL_NO_NATIVE)."""
    return _native.kernels() is not None


def encoded_nbytes(codec: str, numel: int, block: int = DEFAULT_BLOCK) -> int:
    """Exact payload size; callers validate untrusted sizes with it BEFORE allocating."""
    _check_codec(codec)
    _check_block(block)
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise CodecError(f"numel must be a non-negative int, got {numel!r}")
    if codec in _ELEMENT_BYTES:
        return _ELEMENT_BYTES[codec] * numel
    per_byte = _codec_ref.PER_BYTE[codec]
    n_scales = _codec_ref.n_blocks(numel, block)
    return _codec_ref.SCALE_BYTES * n_scales + -(-numel // per_byte)


def encode(codec: str, x: torch.Tensor, block: int = DEFAULT_BLOCK) -> bytes:
    """Encode x.flatten() as float32 values; raises CodecError on NaN/Inf.

    x is any-shape float tensor (fp32/bf16/fp16/...); other devices are copied to CPU.
    """
    _check_codec(codec)
    _check_block(block)
    flat = _flat_float32(x)
    if codec in _native.NATIVE_CODECS and native_available():
        return _encode_native(codec, flat, block)
    if not all_finite(flat):
        raise _non_finite(codec)
    if codec == "fp32":
        return flat.numpy().astype("<f4", copy=False).tobytes()
    if codec == "bf16":
        bits = flat.to(torch.bfloat16).view(torch.int16).numpy()
        return bits.astype("<i2", copy=False).tobytes()
    return _codec_ref.encode(codec, flat, block)


def decode(
    codec: str,
    payload: bytes | bytearray | memoryview,
    numel: int,
    block: int = DEFAULT_BLOCK,
) -> torch.Tensor:
    """Return a new 1-D float32 tensor of numel values.

    Raises CodecError if len(payload) != encoded_nbytes(codec, numel, block).
    """
    expected = encoded_nbytes(codec, numel, block)
    buf = _payload_bytes(payload)
    if buf.size != expected:
        raise CodecError(f"{codec} payload for {numel} values (block {block}) must be {expected} bytes, got {buf.size}")
    if codec == "fp32":
        return torch.from_numpy(buf.view("<f4").astype(np.float32))
    if codec == "bf16":
        bits = buf.view("<u2").astype(np.uint32) << 16
        return torch.from_numpy(bits.view(np.float32))
    if codec in _native.NATIVE_CODECS and native_available():
        return _decode_native(codec, buf, numel, block)
    return _codec_ref.decode(codec, buf, numel, block)


def roundtrip(codec: str, x: torch.Tensor, block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """decode(encode(x)) shaped like x: what the syncer will see (learner error feedback)."""
    return decode(codec, encode(codec, x, block), x.numel(), block).view(x.shape)


def _check_codec(codec: str) -> None:
    if codec not in CODECS:
        raise CodecError(f"unknown codec {codec!r}; expected one of {', '.join(CODECS)}")


def _check_block(block: int) -> None:
    if not block_ok(block):
        raise CodecError(f"block must be a multiple of 8 in [{MIN_BLOCK}, {MAX_BLOCK}], got {block!r}")


def _non_finite(codec: str) -> CodecError:
    return CodecError(f"cannot encode {codec}: input contains NaN or Inf")


def all_finite(flat: torch.Tensor) -> bool:
    """No NaN/Inf; aminmax propagates NaN and is ~10x faster than isfinite().all()."""
    if flat.numel() == 0:
        return True
    lo, hi = torch.aminmax(flat)
    return math.isfinite(lo.item()) and math.isfinite(hi.item())


def _flat_float32(x: torch.Tensor) -> torch.Tensor:
    """x as a contiguous 1-D float32 CPU tensor (no copy when it already is one)."""
    if not isinstance(x, torch.Tensor):
        raise CodecError(f"expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise CodecError(f"expected a floating-point tensor, got dtype {x.dtype}")
    return x.detach().reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()


def _payload_bytes(payload: bytes | bytearray | memoryview) -> np.ndarray:
    """A read-only uint8 view of the payload, without copying it."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise CodecError(f"payload must be bytes-like, got {type(payload).__name__}")
    try:
        view = memoryview(payload).cast("B")
    except TypeError as exc:
        raise CodecError(f"payload must be a contiguous buffer: {exc}") from exc
    return np.frombuffer(view, dtype=np.uint8)


def _encode_native(codec: str, flat: torch.Tensor, block: int) -> bytes:
    numel = flat.numel()
    out = np.empty(encoded_nbytes(codec, numel, block), dtype=np.uint8)
    scales = out.ctypes.data
    codes = scales + _codec_ref.SCALE_BYTES * _codec_ref.n_blocks(numel, block)
    if not _native.encode_into(codec, flat.data_ptr(), numel, block, scales, codes):
        raise _non_finite(codec)
    return out.tobytes()


def _decode_native(codec: str, buf: np.ndarray, numel: int, block: int) -> torch.Tensor:
    out = torch.empty(numel, dtype=torch.float32)
    scales = buf.ctypes.data
    codes = scales + _codec_ref.SCALE_BYTES * _codec_ref.n_blocks(numel, block)
    _native.decode_into(codec, scales, codes, numel, block, out.data_ptr())
    return out
