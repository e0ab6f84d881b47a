"""The self-describing, versioned, checksummed frame every message travels in.

Layout (all integers little-endian)::

    offset  size  field
    0       4     magic b"DDLW"
    4       2     format version (1)
    6       2     reserved, 0
    8       4     header length H in bytes
    12      8     payload length P in bytes
    20      H     header: UTF-8 JSON object (kind, meta, codec, block, tensors)
    20+H    P     payload: each tensor's codec bytes, back to back, in table order
    20+H+P  4     CRC-32 of bytes [0, 20+H+P)

The tensor table lists ``{"name", "shape", "offset", "nbytes"}``; ``nbytes``
must equal the codec's exact size for the shape and entries must tile the
payload. No pickle anywhere: decoding parses JSON and numbers, checks every
size against ``WireLimits`` before allocating, and raises ``WireError`` with
the reason on anything that does not add up.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ddctl_agents.core import codec as codecs
from ddctl_agents.core.crc import crc32
from ddctl_agents.core.packed import Packed, PackedTensors, packable
from ddctl_agents.errors import WireError

MAGIC = b"DDLW"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<4sHHIQ")
_CRC = struct.Struct("<I")


@dataclass(frozen=True, slots=True, kw_only=True)
class WireLimits:
    """Bounds checked before any allocation; a peer cannot make us allocate more."""

    max_header: int = 1 << 20
    max_payload: int = 1 << 31
    max_tensors: int = 4096
    max_numel: int = 1 << 31
    max_rank: int = 8


DEFAULT_LIMITS = WireLimits()


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    """A decoded frame: what kind of message, its metadata and its tensors."""

    kind: str
    meta: dict[str, Any]
    codec: str
    block: int
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    nbytes: int = 0


def pack(
    kind: str, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], codec: str, block: int = codecs.DEFAULT_BLOCK
) -> bytes:
    """Encode tensors with ``codec`` and frame them with their metadata."""
    table, chunks, offset = [], [], 0
    for name in sorted(tensors):
        t = tensors[name]
        blob = codecs.encode(codec, t, block)
        table.append({"name": name, "shape": list(t.shape), "offset": offset, "nbytes": len(blob)})
        chunks.append(blob)
        offset += len(blob)
    header = json.dumps(
        {"kind": kind, "meta": dict(meta), "codec": codec, "block": block, "tensors": table},
        separators=(",", ":"),
        sort_keys=True,
        allow_nan=False,
    ).encode()
    body = b"".join([_PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(header), offset), header, *chunks])
    return body + _CRC.pack(crc32(body))


def unpack(
    data: bytes | bytearray | memoryview,
    limits: WireLimits = DEFAULT_LIMITS,
    expect: str | None = None,
    keep_packed: bool = False,
    tensors: bool = True,
) -> Frame:
    """Validate and decode a frame; never trusts a length it has not checked.

    ``keep_packed`` leaves int8/int4 tensors in their wire form (``packed.PackedTensors``, decoded
    on access); ``data`` must then not change while they live (bytes never do). Without ``tensors`` the frame is
    checked whole (sizes, checksum, header, tensor table) and its tensors are left undecoded (a relay forwards it)."""
    view = memoryview(data)
    header, payload_len, body_end = _check_frame(view, limits)
    head = _parse_header(bytes(view[_PREFIX.size : _PREFIX.size + header]))
    if expect is not None and head["kind"] != expect:
        raise WireError(f"expected a {expect!r} frame, got {head['kind']!r:.60}")
    payload = view[_PREFIX.size + header : body_end]
    entries = _check_table(head, payload_len, limits)
    decoded: Mapping[str, torch.Tensor]
    if not tensors:
        decoded = {}
    elif keep_packed and packable(head["codec"]):
        decoded = PackedTensors(
            {
                name: Packed(head["codec"], payload[off : off + nb], tuple(shape), head["block"])
                for name, shape, _, off, nb in entries
            }
        )
    else:
        decoded = {
            name: codecs.decode(head["codec"], payload[off : off + nb], numel, head["block"]).reshape(shape)
            for name, shape, numel, off, nb in entries
        }
    return Frame(
        kind=head["kind"], meta=head["meta"], codec=head["codec"], block=head["block"], tensors=decoded, nbytes=len(view)
    )


def _check_frame(view: memoryview, limits: WireLimits) -> tuple[int, int, int]:
    if len(view) < _PREFIX.size + _CRC.size:
        raise WireError(f"frame truncated: {len(view)} bytes is shorter than the {_PREFIX.size + _CRC.size}-byte minimum")
    magic, version, _, header, payload = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise WireError(f"not a ddctl frame (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise WireError(f"unsupported wire format version {version}; this build speaks {FORMAT_VERSION}")
    if header > limits.max_header:
        raise WireError(f"header of {header} bytes exceeds the {limits.max_header}-byte limit")
    if payload > limits.max_payload:
        raise WireError(f"payload of {payload} bytes exceeds the {limits.max_payload}-byte limit")
    body_end = _PREFIX.size + header + payload
    if len(view) != body_end + _CRC.size:
        raise WireError(
            f"frame length {len(view)} does not match its header ({body_end + _CRC.size} expected): truncated or padded"
        )
    (crc,) = _CRC.unpack_from(view, body_end)
    if crc32(view[:body_end]) != crc:
        raise WireError("checksum mismatch: the frame was corrupted in transit")
    return header, payload, body_end


def _parse_header(raw: bytes) -> dict[str, Any]:
    try:
        head = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or an integer past Python's 4300 digits
        raise WireError(f"header is not valid UTF-8 JSON: {str(exc)[:200]}") from None
    if not isinstance(head, dict):
        raise WireError("header must be a JSON object")
    expected = {"kind": str, "meta": dict, "codec": str, "block": int, "tensors": list}
    for key, typ in expected.items():
        if not isinstance(head.get(key), typ) or isinstance(head.get(key), bool):
            raise WireError(f"header field {key!r} must be a {typ.__name__}")
    if head["codec"] not in codecs.CODECS:
        raise WireError(f"unknown codec {head['codec']!r:.60}; allowed: {', '.join(codecs.CODECS)}")
    return head


def _check_table(head: dict[str, Any], payload_len: int, limits: WireLimits) -> list[tuple[str, list[int], int, int, int]]:
    table = head["tensors"]
    if len(table) > limits.max_tensors:
        raise WireError(f"{len(table)} tensors exceed the limit of {limits.max_tensors}")
    entries, seen, cursor = [], set(), 0
    for i, entry in enumerate(table):
        name, shape, off, nb = _entry_fields(entry, i, limits)
        if name in seen:
            raise WireError(f"tensor {name!r:.80} appears twice")
        seen.add(name)
        numel = 1
        for d in shape:
            numel *= d
        if numel > limits.max_numel:
            raise WireError(f"tensor {name!r:.80} has {numel} elements, over the limit of {limits.max_numel}")
        try:
            want = codecs.encoded_nbytes(head["codec"], numel, head["block"])
        except codecs.CodecError as exc:
            raise WireError(f"tensor {name!r:.80}: {exc}") from None
        if nb != want:
            raise WireError(f"tensor {name!r:.80}: {nb} bytes declared, {head['codec']} needs {want} for shape {shape}")
        if off != cursor:
            raise WireError(f"tensor {name!r:.80} starts at {off}, expected {cursor}: entries must tile the payload")
        cursor += nb
        entries.append((name, shape, numel, off, nb))
    if cursor != payload_len:
        raise WireError(f"tensor table covers {cursor} bytes but the payload has {payload_len}")
    return entries


def _entry_fields(entry: object, i: int, limits: WireLimits) -> tuple[str, list[int], int, int]:
    if not isinstance(entry, dict):
        raise WireError(f"tensor table entry {i} must be an object")
    name, shape, off, nb = entry.get("name"), entry.get("shape"), entry.get("offset"), entry.get("nbytes")
    if not isinstance(name, str) or not 0 < len(name) <= 256:
        raise WireError(f"tensor table entry {i}: name must be a string of 1-256 characters")
    if not isinstance(shape, list) or len(shape) > limits.max_rank or not all(is_count(d) for d in shape):
        raise WireError(f"tensor {name!r:.80}: shape must be a list of at most {limits.max_rank} non-negative integers")
    if not is_count(off) or not is_count(nb):
        raise WireError(f"tensor {name!r:.80}: offset and nbytes must be non-negative integers")
    return name, shape, int(off), int(nb)  # type: ignore[arg-type]  # is_count checked both


def is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 62
