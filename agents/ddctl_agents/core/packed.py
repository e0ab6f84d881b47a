"""Tensors that stay in their int8/int4 wire form until something needs their values.

Why: the syncer holds every pending update of a round and, at the round's close,
merges them. Decoded, an int4 update is 7x larger than on the wire and the merge
makes several passes over M full fp32 copies; packed, the admission check and
RDA's norms come from the codes (``stats``) and the merge and outer step run in
one native pass over them (``fused_round``). Anything else that asks for a value
gets the decoded tensor, exactly what ``codec.decode`` gives, computed once.

Only frames whose codec the native kernels read are kept packed (``packable``);
the wire layer has already checked every size, so decoding later cannot fail.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ddctl_agents.core import _codec_ref, _native
from ddctl_agents.core import codec as codecs


def packable(codec: str) -> bool:
    """True when tensors of ``codec`` can stay packed (the native kernels read them)."""
    return codec in _native.NATIVE_CODECS and codecs.native_available()


class Packed:
    """One tensor's codes and scales as they came off the wire, with its shape."""

    __slots__ = ("_stats", "block", "buffer", "codec", "numel", "payload", "shape")

    def __init__(self, codec: str, payload: memoryview, shape: tuple[int, ...], block: int) -> None:
        self.codec, self.block, self.shape = codec, block, shape
        self.numel = int(np.prod(shape, dtype=np.int64))
        self.payload = payload
        self.buffer = np.frombuffer(payload, dtype=np.uint8)
        self._stats: tuple[float, float] | None = None

    @property
    def scales(self) -> int:
        """Address of the float32 scales (the buffer's start)."""
        return int(self.buffer.ctypes.data)

    @property
    def codes(self) -> int:
        """Address of the codes, after one scale per block."""
        return self.scales + _codec_ref.SCALE_BYTES * _codec_ref.n_blocks(self.numel, self.block)

    def decode(self) -> torch.Tensor:
        """The values as a new float32 tensor of ``shape``."""
        return codecs.decode(self.codec, self.payload, self.numel, self.block).reshape(self.shape)

    def stats(self) -> tuple[float, float]:
        """(sum of squares, max |value|) of the decoded values, from the codes; NaN if any value would be."""
        if self._stats is None:
            self._stats = _native.packed_stats(self.codec, self.scales, self.codes, self.numel, self.block)
        return self._stats

    def norm(self) -> float:
        """The L2 norm of the decoded values."""
        return float(np.sqrt(self.stats()[0]))


class PackedTensors(Mapping[str, torch.Tensor]):
    """A frame's tensors, kept packed; indexing decodes (once) for code that needs the values."""

    def __init__(self, packed: Mapping[str, Packed]) -> None:
        self.packed: dict[str, Packed] = dict(packed)
        self._decoded: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._decoded:
            self._decoded[name] = self.packed[name].decode()
        return self._decoded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.packed)

    def __len__(self) -> int:
        return len(self.packed)


class PackedSum(Mapping[str, torch.Tensor]):
    """A learner's consecutive updates for one round (``rounds.accumulate``), each still packed: the fused round
    merges their codes; indexing decodes and adds them in arrival order (once), what adding them eagerly gives."""

    def __init__(self, parts: Sequence[PackedTensors]) -> None:
        self.parts = tuple(parts)
        self._sums: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._sums:
            total = self.parts[0].packed[name].decode()
            for part in self.parts[1:]:
                total = total + part.packed[name].decode()
            self._sums[name] = total
        return self._sums[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.parts[-1])

    def __len__(self) -> int:
        return len(self.parts[-1])


def packed_parts(tensors: Mapping[str, torch.Tensor]) -> tuple[PackedTensors, ...] | None:
    """The packed updates ``tensors`` adds up (one for a single frame); None when its values are already decoded."""
    if isinstance(tensors, PackedTensors):
        return (tensors,)
    if isinstance(tensors, PackedSum):
        return tensors.parts
    return None


def measure(tensors: Mapping[str, torch.Tensor]) -> None:
    """Take a packed frame's stats now (a worker thread's job: admission, on the syncer's one core thread, then only
    reads them); nothing to do for decoded tensors."""
    if isinstance(tensors, PackedTensors):
        for p in tensors.packed.values():
            p.stats()


def shape_of(tensors: Mapping[str, torch.Tensor], name: str) -> tuple[tuple[int, ...], torch.dtype]:
    """(shape, dtype) of one tensor, without decoding a packed one (packed values are float32)."""
    if isinstance(tensors, PackedTensors):
        return tensors.packed[name].shape, torch.float32
    t = tensors[name]
    return tuple(t.shape), t.dtype


def absmax_of(tensors: Mapping[str, torch.Tensor], name: str) -> float | None:
    """max |value| of a packed tensor from its codes; None when it is not packed (the caller measures it)."""
    if isinstance(tensors, PackedTensors):
        return tensors.packed[name].stats()[1]
    return None


BYTES_PER_VALUE = 3
"""Bytes of a packed buffer per float32 value of a snapshot: every integer below 2**24 is exact in float32."""


def stored(parts: Sequence[PackedTensors], key: str) -> tuple[list[dict[str, list[Any]]], dict[str, torch.Tensor]]:
    """A pending update's packed parts as a snapshot keeps them: each tensor's codec, block, byte count and bytes per
    value, and its bytes as float32 values (the state frame is fp32), three little-endian bytes to a value, under
    ``key/part/name``. One byte to a value made an update 4x its wire size in every snapshot; three make it
    4/3. Restored decoded, the round would take the reference path where the live one took the fused path, and a
    recovered model would differ from the one acknowledged in its last bits (``fused_round``: they agree to rounding)."""
    specs: list[dict[str, list[Any]]] = []
    tensors: dict[str, torch.Tensor] = {}
    for i, part in enumerate(parts):
        specs.append({n: [p.codec, p.block, len(p.buffer), BYTES_PER_VALUE] for n, p in part.packed.items()})
        tensors.update({f"{key}/{i}/{n}": _as_values(p.buffer) for n, p in part.packed.items()})
    return specs, tensors


def _as_values(buffer: np.ndarray) -> torch.Tensor:
    """Three bytes to a value, the last one's missing bytes zero. Each value but the last reads the four bytes at its
    offset in place (the fourth masked off), so the codes are not copied first."""
    out = np.empty(-(-len(buffer) // BYTES_PER_VALUE), dtype=np.float32)
    inside = max((len(buffer) - 1) // BYTES_PER_VALUE, 0)  # values whose four bytes all lie in the buffer
    if inside:
        out[:inside] = np.ndarray((inside,), dtype="<u4", buffer=buffer, strides=(BYTES_PER_VALUE,)) & 0xFFFFFF
    if len(out) > inside:
        out[inside] = int.from_bytes(buffer[inside * BYTES_PER_VALUE :].tobytes(), "little")
    return torch.from_numpy(out)


def _as_bytes(values: torch.Tensor, nbytes: int, per_value: int) -> bytes | None:
    """``_as_values`` undone (or one byte a value, as snapshots before it kept them); None when ``values`` are not
    exactly ``nbytes`` bytes so packed: a count, a value that is no whole number in range, a padding byte not zero."""
    limit = 1 << (8 * per_value)
    if values.numel() != -(-nbytes // per_value) or bool(((values < 0) | (values >= limit) | (values != values.round())).any()):
        return None
    words = values.to(torch.int64).numpy().astype("<u4").view(np.uint8).reshape(-1, 4)[:, :per_value].reshape(-1)
    return None if words[nbytes:].any() else words[:nbytes].tobytes()


def restored(
    specs: Sequence[Mapping[str, Sequence[Any]]], tensors: Mapping[str, torch.Tensor], key: str,
    shapes: Mapping[str, tuple[int, ...]],
) -> PackedTensors | PackedSum:  # fmt: skip
    """``stored``'s parts packed again, each checked as the wire checks a frame (the native kernels trust sizes):
    a ValueError names what does not fit."""
    parts = []
    for i, spec in enumerate(specs):
        if set(spec) != set(shapes):
            raise ValueError(f"{key}: part {i} has other tensors than the fragment's")
        packs = {}
        for n, shape in shapes.items():
            record = spec[n]
            if not isinstance(record, list) or len(record) not in (3, 4):
                raise ValueError(f"{key}/{i}/{n}: {record!r:.60} is not [codec, block, bytes(, bytes per value)]")
            codec, block, nbytes, per = [*record, 1][:4]  # records from before three bytes a value have no fourth
            numel = int(np.prod(shape, dtype=np.int64))
            if (
                codec not in _native.NATIVE_CODECS
                or type(nbytes) is not int
                or nbytes != codecs.encoded_nbytes(codec, numel, block)
            ):
                raise ValueError(f"{key}/{i}/{n}: {nbytes!r:.20} bytes of {codec!r:.20} in blocks of {block!r:.20}, not {shape}")
            if type(per) is not int or per not in (1, BYTES_PER_VALUE):
                raise ValueError(f"{key}/{i}/{n}: {per!r:.20} bytes per value; 1 or {BYTES_PER_VALUE} are read")
            raw = _as_bytes(tensors[f"{key}/{i}/{n}"].reshape(-1), nbytes, per)
            if raw is None:
                raise ValueError(f"{key}/{i}/{n}: not the {nbytes} bytes its record says")
            packs[n] = Packed(codec, memoryview(raw), shape, block)
        parts.append(PackedTensors(packs))
    if not parts:
        raise ValueError(f"{key}: no parts")
    return parts[0] if len(parts) == 1 else PackedSum(parts)
