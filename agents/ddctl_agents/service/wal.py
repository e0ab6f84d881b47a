"""Write-ahead log of everything that changes the syncer's state.

Each record is ``<u32 meta length><u64 payload length><u32 crc32>`` followed by
a JSON meta object and an opaque payload (an update's wire frame as it came in).
Records go to numbered segment files; a snapshot rotates to a new segment so
that recovery is "load the snapshot, replay the segments after it". A torn
tail (a crash mid-write) fails its length or CRC check and is cut off on open:
it was never acknowledged, because acknowledgements wait for ``sync``.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ddctl_agents.core.crc import crc32
from ddctl_agents.errors import LogError

_HEAD = struct.Struct("<IQI")
MAX_META = 1 << 20


def record_prefix(meta: dict[str, Any], payload: bytes | bytearray | memoryview = b"") -> bytes:
    """A record's head and JSON meta; the payload follows it unchanged (not copied here)."""
    raw = json.dumps(meta, separators=(",", ":"), allow_nan=False).encode()
    if len(raw) > MAX_META:
        raise LogError(f"log record meta of {len(raw)} bytes exceeds {MAX_META}: recovery would stop at it")
    crc = crc32(payload, crc32(raw))
    return _HEAD.pack(len(raw), len(payload), crc) + raw


def append_record(path: Path, meta: dict[str, Any], payload: bytes | bytearray | memoryview = b"") -> None:
    """Append one record to a standalone file durably (the quarantine file, not the log)."""
    with path.open("ab") as f:
        f.write(record_prefix(meta, payload))
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


@dataclass(frozen=True, slots=True)
class WalRecord:
    meta: dict[str, Any]
    payload: bytes


def segment_path(directory: Path, number: int) -> Path:
    return directory / f"{number:08d}.wal"


def segments(directory: Path) -> list[int]:
    """Segment numbers present, ascending."""
    return sorted(int(p.stem) for p in directory.glob("*.wal") if p.stem.isdigit())


def read_segment(path: Path) -> Iterator[WalRecord]:
    """Records of one segment up to the first torn or corrupt one."""
    with path.open("rb") as f:
        while True:
            head = f.read(_HEAD.size)
            if len(head) < _HEAD.size:
                return
            meta_len, payload_len, crc = _HEAD.unpack(head)
            if meta_len > MAX_META:
                return
            body = f.read(meta_len + payload_len)
            if len(body) < meta_len + payload_len or crc32(body) != crc:
                return
            yield WalRecord(meta=json.loads(body[:meta_len]), payload=body[meta_len:])


def _valid_length(path: Path) -> int:
    """Byte length of the intact prefix of a segment."""
    end = 0
    with path.open("rb") as f:
        while True:
            head = f.read(_HEAD.size)
            if len(head) < _HEAD.size:
                return end
            meta_len, payload_len, crc = _HEAD.unpack(head)
            body = f.read(meta_len + payload_len) if meta_len <= MAX_META else b""
            if meta_len > MAX_META or len(body) < meta_len + payload_len or crc32(body) != crc:
                return end
            end = f.tell()


class Wal:
    """Appends records to the newest segment; ``sync`` makes everything appended so far durable.

    Appends come from the syncer's core thread, ``sync`` from an I/O thread: a lock
    orders them, and the fsync itself runs outside it so appends never wait on the disk.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        existing = segments(directory)
        self.segment = existing[-1] if existing else 0
        path = segment_path(directory, self.segment)
        if path.exists():
            with path.open("r+b") as f:
                f.truncate(_valid_length(path))
        self._file: IO[bytes] = path.open("ab")
        self._lock = threading.Lock()
        self.appended = 0
        """Records appended by this process (a monotone position for group commit)."""
        self.bytes_written = 0

    def append(self, meta: dict[str, Any], payload: bytes | bytearray | memoryview = b"") -> int:
        prefix = record_prefix(meta, payload)
        with self._lock:
            self._file.write(prefix)
            self._file.write(payload)
            self.appended += 1
            self.bytes_written += len(prefix) + len(payload)
            return self.appended

    def sync(self) -> int:
        """Flush and fsync; returns the position now durable."""
        with self._lock:
            self._file.flush()
            position, fd = self.appended, os.dup(self._file.fileno())
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
        return position

    def rotate(self) -> int:
        """Close the current segment durably and start the next; returns the new segment number."""
        with self._lock:
            self._file.flush()
            os.fdatasync(self._file.fileno())
            self._file.close()
            self.segment += 1
            self._file = segment_path(self.directory, self.segment).open("ab")
            return self.segment

    def drop_before(self, segment: int) -> None:
        """Delete segments a durable snapshot has made redundant."""
        for number in segments(self.directory):
            if number < segment:
                segment_path(self.directory, number).unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
