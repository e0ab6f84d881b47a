from __future__ import annotations

import json
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
