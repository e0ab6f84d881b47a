"""The event tape: one JSON line per decision, append-only (ALGORITHM.md §7).

The syncer's core emits records (joins, leaves, updates with their status,
round closes with who was admitted and why), each stamped with its vector
clock; the shell adds the run's configuration first and the result last.
Replaying the records in order through the same core reproduces the run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from ddctl_agents.errors import TapeError

TAPE_FORMAT = 1
RECORD_TYPES = (
    "config", "join", "leave", "failure", "update", "round", "end", "reject", "suspend", "readmit", "fault", "cut", "handoff"
)  # fmt: skip
"""``reject``: a contribution set aside at a merge; ``suspend`` / ``readmit``: the quarantine;
``fault``: a round set aside after an unexpected error (docs/design.md, trust boundary); ``cut``: a global
checkpoint's marker (service/cuts.py); ``handoff``: a fragment moving between shards (core/shard_syncer.py)."""


class TapeWriter:
    """Appends records as JSON lines; each line is flushed so a crash loses at most one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self.count = 0

    @classmethod
    def resume(cls, path: Path, size: int, header: Mapping[str, Any]) -> TapeWriter:
        """The tape cut back to ``size`` bytes (what the log recovered to), ``header`` first if that is nothing."""
        if path.exists():
            with path.open("r+b") as f:
                f.truncate(size)
        tape = cls(path)
        if size == 0:
            tape.write(header)
        return tape

    def write(self, record: Mapping[str, Any]) -> None:
        if record.get("type") not in RECORD_TYPES:
            raise TapeError(f"record type must be one of {', '.join(RECORD_TYPES)}, got {record.get('type')!r}")
        self._file.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
        self._file.flush()
        self.count += 1

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def __enter__(self) -> TapeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


FIELDS: dict[str, type | tuple[type, ...]] = {
    "learner": str, "incarnation": int, "fragment": int, "version": int, "base_version": int, "start_step": int,
    "cadence": int, "step": int, "c_steps": int, "c_tokens": int, "update_id": str, "status": str, "t": (int, float),
    "vclock": dict, "admitted": list,
}  # fmt: skip
"""The type of each field the records share, wherever one holds it: a tape is read back from a file, which may be
anything (a learner's name that is a number reached the replay as one and raised far from the tape)."""


def read_tape(path: Path) -> Iterator[dict[str, Any]]:
    """Yield records in order; the first must be a config record of a known format, and each field ``FIELDS``
    names must have its type."""
    try:
        lines = path.open("rb")
    except OSError as exc:
        raise TapeError(f"cannot open tape {path}: {exc.strerror}") from None
    with lines:
        for number, raw in enumerate(lines, 1):
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise TapeError(f"{path}:{number}: not UTF-8 text (byte {exc.start} of the line); a tape is JSON lines") from None
            except json.JSONDecodeError as exc:
                raise TapeError(f"{path}:{number}: not a JSON record ({exc.msg})") from None
            except (ValueError, RecursionError) as exc:  # an integer past Python's 4300 digits, nesting past the stack
                raise TapeError(f"{path}:{number}: not a JSON record ({str(exc)[:80]})") from None
            if not isinstance(record, dict) or record.get("type") not in RECORD_TYPES:
                raise TapeError(f"{path}:{number}: record must be an object with a type in {', '.join(RECORD_TYPES)}")
            for field, kind in FIELDS.items():
                value = record.get(field)
                if field in record and (isinstance(value, bool) or not isinstance(value, kind)):
                    raise TapeError(f"{path}:{number}: {record['type']} record's {field} must be {_named(kind)}, "
                                    f"got {value!r:.40}")  # fmt: skip
            if number == 1 and (record["type"] != "config" or record.get("format") != TAPE_FORMAT):
                raise TapeError(f"{path}:1: a tape starts with a config record of format {TAPE_FORMAT}")
            yield record


def _named(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", dict: "an object", list: "a list"}
    return "a number" if isinstance(kind, tuple) else names[kind]
