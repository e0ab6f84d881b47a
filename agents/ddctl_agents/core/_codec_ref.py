"""Torch reference implementations of the blockwise codecs (int8, int4, int2, int1).

Why a reference: it runs everywhere (no compiler needed), it is the executable
form of the wire format documented in ``codec.py``, and the native int8/int4
kernels are tested against it byte for byte. Every arithmetic step mirrors the
C kernels: one float32 division for the scale, one for its reciprocal, one
multiply per element, round half to even, clamp; decode is ``q * scale``.

Inputs are already validated by ``codec.py``: ``flat`` is a finite, contiguous
1-D float32 CPU tensor and ``buf`` a uint8 array of exactly the right length.
"""

from __future__ import annotations

import numpy as np
import torch

SCALE_BYTES = 4
#: Largest code magnitude of the symmetric codecs; scale = absmax / level.
LEVELS = {"int8": 127.0, "int4": 7.0}
#: Values per packed byte of the sub-byte codecs.
PER_BYTE = {"int8": 1, "int4": 2, "int2": 4, "int1": 8}
INT2_HALF_RANGE = 1.5


def n_blocks(numel: int, block: int) -> int:
    """Blocks needed for numel values; the last one may be partial."""
    return -(-numel // block)


def _blocks(flat: torch.Tensor, block: int) -> torch.Tensor:
    """View flat as (n_blocks, block), padding the tail block with zeros."""
    pad = n_blocks(flat.numel(), block) * block - flat.numel()
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.view(-1, block)


def _inverse(scale: torch.Tensor) -> torch.Tensor:
    """1/scale, or 0 where that overflows (all-zero or denormal-tiny blocks)."""
    inv = 1.0 / scale
    return torch.where(torch.isfinite(inv), inv, torch.zeros_like(inv))


def _pack(codes: torch.Tensor, numel: int, bits: int) -> torch.Tensor:
    """Pack unsigned codes (< 2**bits): element per*j+i goes to bits bits*i.. of byte j."""
    per = 8 // bits
    codes = codes.reshape(-1)[:numel].to(torch.uint8)
    pad = -numel % per
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad)])
    codes = codes.view(-1, per)
    out = codes[:, 0].clone()
    for i in range(1, per):
        out |= codes[:, i] << (bits * i)
    return out


def _unpack(packed: torch.Tensor, numel: int, bits: int) -> torch.Tensor:
    """Inverse of _pack: unsigned codes as uint8, length numel."""
    mask = (1 << bits) - 1
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    return ((packed[:, None] >> shifts) & mask).reshape(-1)[:numel]


def _to_payload(scale: torch.Tensor, codes: torch.Tensor) -> bytes:
    """Scales (float32 LE) followed by the code bytes."""
    scale_le = scale.numpy().astype("<f4", copy=False)
    return scale_le.tobytes() + codes.numpy().tobytes()


def _split(buf: np.ndarray, numel: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Payload bytes -> (scales as float32, code bytes as uint8), both copies."""
    head = n_blocks(numel, block) * SCALE_BYTES
    scale = torch.from_numpy(buf[:head].view("<f4").astype(np.float32))
    return scale, torch.from_numpy(buf[head:].copy())


def _expand(values: torch.Tensor, scale: torch.Tensor, numel: int, block: int) -> torch.Tensor:
    """Multiply per-element float values by their block's scale; returns numel floats."""
    pad = scale.numel() * block - numel
    if pad:
        values = torch.cat([values, values.new_zeros(pad)])
    return (values.view(-1, block) * scale[:, None]).reshape(-1)[:numel].contiguous()


def encode(codec: str, flat: torch.Tensor, block: int) -> bytes:
    """Reference encoder for the blockwise codecs."""
    blocks = _blocks(flat, block)
    if codec == "int1":
        # float64 sum: a block of large values must not overflow before the division.
        mean = blocks.abs().double().sum(dim=1) / _block_lengths(flat.numel(), block)
        scale = mean.to(torch.float32)
        return _to_payload(scale, _pack(blocks < 0, flat.numel(), 1))
    absmax = blocks.abs().amax(dim=1)
    if codec == "int2":
        scale = absmax / INT2_HALF_RANGE
        y = blocks * _inverse(scale)[:, None]
        codes = torch.floor(y + 2.0).clamp_(0, 3)
        return _to_payload(scale, _pack(codes, flat.numel(), 2))
    level = LEVELS[codec]
    scale = absmax / level
    q = torch.round(blocks * _inverse(scale)[:, None]).clamp_(-level, level).to(torch.int8)
    if codec == "int8":
        return _to_payload(scale, q.reshape(-1)[: flat.numel()])
    return _to_payload(scale, _pack(q & 0x0F, flat.numel(), 4))


def _block_lengths(numel: int, block: int) -> torch.Tensor:
    """Number of real (unpadded) values in each block, as float64."""
    lengths = torch.full((n_blocks(numel, block),), float(block), dtype=torch.float64)
    if numel % block:
        lengths[-1] = float(numel % block)
    return lengths


def decode(codec: str, buf: np.ndarray, numel: int, block: int) -> torch.Tensor:
    """Reference decoder for the blockwise codecs; returns a new 1-D float32 tensor."""
    scale, codes = _split(buf, numel, block)
    if codec == "int8":
        values = codes.view(torch.int8).to(torch.float32)
    elif codec == "int4":
        nibbles = _unpack(codes, numel, 4).to(torch.int8)
        values = ((nibbles ^ 8) - 8).to(torch.float32)
    elif codec == "int2":
        values = _unpack(codes, numel, 2).to(torch.float32) - INT2_HALF_RANGE
    else:
        values = 1.0 - 2.0 * _unpack(codes, numel, 1).to(torch.float32)
    return _expand(values, scale, numel, block)
