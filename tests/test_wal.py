"""The write-ahead log: records come back intact, a torn tail is cut, rotation and cleanup."""

from __future__ import annotations

from pathlib import Path

from ddctl_agents.service.wal import Wal, read_segment, segment_path, segments


def test_records_round_trip_in_order(tmp_path: Path) -> None:
    wal = Wal(tmp_path)
    positions = [wal.append({"kind": "update", "i": i}, bytes([i]) * (i * 100)) for i in range(5)]
    assert positions == [1, 2, 3, 4, 5]
    assert wal.sync() == 5
    wal.close()
    records = list(read_segment(segment_path(tmp_path, 0)))
    assert [r.meta["i"] for r in records] == list(range(5))
    assert [len(r.payload) for r in records] == [0, 100, 200, 300, 400]


def test_a_torn_tail_is_ignored_and_cut_on_reopen(tmp_path: Path) -> None:
    wal = Wal(tmp_path)
    wal.append({"kind": "join", "n": 1})
    wal.append({"kind": "join", "n": 2}, b"x" * 1000)
    wal.close()
    path = segment_path(tmp_path, 0)
    intact = path.stat().st_size
    with path.open("r+b") as f:  # a crash in the middle of the second record
        f.truncate(intact - 10)
    assert [r.meta["n"] for r in read_segment(path)] == [1]
    reopened = Wal(tmp_path)
    reopened.append({"kind": "join", "n": 3})
    reopened.close()
    assert [r.meta["n"] for r in read_segment(path)] == [1, 3]


def test_a_corrupt_record_ends_the_segment(tmp_path: Path) -> None:
    wal = Wal(tmp_path)
    for n in range(3):
        wal.append({"n": n}, b"payload")
    wal.close()
    path = segment_path(tmp_path, 0)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert len(list(read_segment(path))) < 3


def test_rotation_starts_a_segment_and_drop_before_removes_old_ones(tmp_path: Path) -> None:
    wal = Wal(tmp_path)
    wal.append({"n": 0})
    assert wal.rotate() == 1
    wal.append({"n": 1})
    assert segments(tmp_path) == [0, 1]
    wal.drop_before(1)
    assert segments(tmp_path) == [1]
    wal.close()
    assert [r.meta["n"] for r in read_segment(segment_path(tmp_path, 1))] == [1]
    again = Wal(tmp_path)
    assert again.segment == 1
    again.close()
