"""The frames' and log records' CRC-32 is zlib's on every input, native or not."""

from __future__ import annotations

import os
import zlib

import pytest

from ddctl_agents.core import _native
from ddctl_agents.core.crc import NATIVE_FROM, crc32

pytestmark = pytest.mark.usefixtures("native_kernels")

DATA = os.urandom(NATIVE_FROM * 4 + 200)


SIZES = [NATIVE_FROM - 1, NATIVE_FROM, NATIVE_FROM + 1, NATIVE_FROM + 15, NATIVE_FROM + 63, NATIVE_FROM * 3 + 17]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("offset", [0, 1, 7, 15])
def test_crc32_is_zlibs_at_every_length_alignment_and_starting_value(offset: int, size: int) -> None:
    piece = memoryview(DATA)[offset : offset + size]
    for value in (0, 1, 0xFFFFFFFF, 0x12345678):
        assert crc32(piece, value) == zlib.crc32(piece, value)
    assert crc32(bytes(piece)) == crc32(bytearray(piece)) == zlib.crc32(piece)


def test_a_crc32_continued_over_pieces_is_the_crc32_of_the_whole() -> None:
    """What the log does: the record's header, then its payload, as one checksum."""
    head, body = DATA[:100], DATA[100:]
    assert crc32(body, crc32(head)) == zlib.crc32(DATA)


def test_crc32_without_the_native_kernels_is_zlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_native.NO_NATIVE_ENV, "1")
    assert crc32(DATA) == zlib.crc32(DATA)


def test_every_single_bit_flip_changes_the_crc() -> None:
    """The native path detects what a checksum must: here, a flipped bit anywhere in a 128 KiB frame body."""
    body = bytearray(DATA[: NATIVE_FROM * 2])
    clean = crc32(body)
    for at in range(0, len(body), 4099):
        body[at] ^= 0x10
        assert crc32(body) != clean
        body[at] ^= 0x10
