from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ddctl_agents.core.tape import TAPE_FORMAT, TapeError, TapeWriter, read_tape


def test_records_are_appended_as_lines_and_read_back_in_order(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TapeWriter(path) as tape:
        tape.write({"type": "config", "format": TAPE_FORMAT})
        tape.write({"type": "join", "learner": "L0"})
        assert tape.count == 2
    assert [r["type"] for r in read_tape(path)] == ["config", "join"]
    assert len(path.read_text().splitlines()) == 2


def test_each_record_is_on_disk_before_the_next_is_written(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    tape = TapeWriter(path)
    tape.write({"type": "config", "format": TAPE_FORMAT})
    assert json.loads(path.read_text())["type"] == "config"  # flushed, though the writer is still open
    tape.close()


def test_unknown_record_types_and_nan_are_refused(tmp_path: Path) -> None:
    with TapeWriter(tmp_path / "t.jsonl") as tape:
        with pytest.raises(TapeError, match="record type must be one of"):
            tape.write({"type": "gossip"})
        with pytest.raises(ValueError):
            tape.write({"type": "join", "t": float("nan")})


def test_a_tape_of_a_future_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"type": "config", "format": TAPE_FORMAT + 1}) + "\n")
    with pytest.raises(TapeError, match="format"):
        list(read_tape(path))


def test_a_line_that_is_not_utf8_or_a_field_of_the_wrong_type_is_a_tape_error_naming_the_line(tmp_path: Path) -> None:
    """Found by a hostile-input audit: both raised far from the tape (UnicodeDecodeError while reading; a learner named
    5 reached the replay's name parsing as an int, AttributeError), and ``ddctl replay`` ended in a traceback."""
    header = json.dumps({"type": "config", "format": TAPE_FORMAT}) + "\n"
    join = {"type": "join", "t": 0.0, "vclock": {"syncer": 1}, "learner": "L0", "incarnation": 0, "start_step": 0}
    path = tmp_path / "tape.jsonl"
    path.write_bytes(header.encode() + b'{"type":"join","learner":"L\xff"}\n')
    with pytest.raises(TapeError, match=r"tape.jsonl:2: not UTF-8 text \(byte 27 of the line\); a tape is JSON lines"):
        list(read_tape(path))
    for line, says in ((b'{"type":"join","t":' + b"9" * 5000 + b"}", "Exceeds the limit"), (b"[" * 200_000, "recursion")):
        path.write_bytes(header.encode() + line + b"\n")
        with pytest.raises(TapeError, match=rf"tape.jsonl:2: not a JSON record \(.*{says}"):
            list(read_tape(path))
    path.write_text(header + json.dumps(join) + "\n")
    assert [r["type"] for r in read_tape(path)] == ["config", "join"]  # the well-typed record passes
    for field, bad, says in (
        ("learner", 5, "join record's learner must be a string, got 5"),
        ("incarnation", True, "join record's incarnation must be an integer, got True"),
        ("t", "0", "join record's t must be a number, got '0'"),
        ("vclock", [1], "join record's vclock must be an object, got [1]"),
    ):
        path.write_text(header + json.dumps(join | {field: bad}) + "\n")
        with pytest.raises(TapeError, match=rf"tape.jsonl:2: {re.escape(says)}"):
            list(read_tape(path))
