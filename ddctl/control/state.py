"""Local state in one SQLite file: runs, their instances, and what happened to them.

The file lives in the user's data directory (``$DDCTL_HOME``, else
``$XDG_DATA_HOME/ddctl``, else ``~/.local/share/ddctl``). It is a cache of what
ddctl did, not the truth: providers' labels and tags are authoritative, so
``ddctl down`` still finds a run's resources if this file is lost. Every
change is one transaction, so a crash never leaves half a record.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddctl.control.rundir import data_dir
from ddctl.errors import DdctlError

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    state TEXT NOT NULL,
    regions_file TEXT NOT NULL,
    job_dir TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS instances (
    run TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    region TEXT NOT NULL,
    provider TEXT NOT NULL,
    role TEXT NOT NULL,
    state TEXT NOT NULL,
    provider_id TEXT NOT NULL DEFAULT '',
    updated REAL NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run, name)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run TEXT NOT NULL,
    t REAL NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_by_run ON events (run, id);
"""


INSTANCE_COLUMNS = "run, name, region, provider, role, state, provider_id, updated, detail"
GIVEN_UP = "given_up"
"""An instance's state once the controller stopped starting it (``reconcile``'s ``give_up``: it kept failing)."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    created: float
    state: str
    regions_file: str
    job_dir: str
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    run: str
    name: str
    region: str
    provider: str
    role: str
    state: str
    provider_id: str
    updated: float
    detail: dict[str, Any]


class State:
    """The SQLite file; one connection, foreign keys on, WAL journal so readers never block writers."""

    @staticmethod
    def default_path() -> Path:
        return data_dir() / "state.sqlite3"

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or self.default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.executescript(SCHEMA)
            self.db = db
        except sqlite3.DatabaseError as exc:
            if db is not None:
                db.close()
            broken = self.path.is_dir() or exc.sqlite_errorcode == sqlite3.SQLITE_NOTADB  # not "locked": that one passes
            hint = "; it is not a SQLite file: move it aside and ddctl starts a new one (or set DDCTL_HOME)" if broken else ""
            raise DdctlError(f"cannot open ddctl's state database {self.path} ({exc}){hint}") from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> State:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # -- runs -----------------------------------------------------------------------------------
    def create_run(self, run: str, regions_file: str, job_dir: str, detail: dict[str, Any] | None = None) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO runs (id, created, state, regions_file, job_dir, detail) VALUES (?, ?, 'starting', ?, ?, ?)",
                (run, time.time(), regions_file, job_dir, json.dumps(detail or {})),
            )
            db.execute("INSERT INTO events (run, t, kind, detail) VALUES (?, ?, 'run-created', '{}')", (run, time.time()))

    def set_run_state(self, run: str, state: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE runs SET state = ? WHERE id = ?", (state, run))
            db.execute("INSERT INTO events (run, t, kind, detail) VALUES (?, ?, ?, '{}')", (run, time.time(), f"run-{state}"))

    def update_run_detail(self, run: str, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into the run's detail in one transaction (read, merge, write)."""
        with self.transaction() as db:
            row = db.execute("SELECT detail FROM runs WHERE id = ?", (run,)).fetchone()
            if row is not None:
                db.execute("UPDATE runs SET detail = ? WHERE id = ?", (json.dumps({**json.loads(row[0]), **changes}), run))

    def run(self, run: str) -> RunRecord | None:
        row = self.db.execute(
            "SELECT id, created, state, regions_file, job_dir, detail FROM runs WHERE id = ?", (run,)
        ).fetchone()
        return None if row is None else _run(row)

    def runs(self) -> list[RunRecord]:
        rows = self.db.execute("SELECT id, created, state, regions_file, job_dir, detail FROM runs ORDER BY created").fetchall()
        return [_run(row) for row in rows]

    def delete_run(self, run: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM runs WHERE id = ?", (run,))
            db.execute("DELETE FROM events WHERE run = ?", (run,))

    # -- instances ------------------------------------------------------------------------------
    def put_instance(self, record: InstanceRecord) -> None:
        with self.transaction() as db:
            db.execute(
                f"INSERT INTO instances ({INSTANCE_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run, name) DO UPDATE SET "
                "state = excluded.state, provider_id = excluded.provider_id, "
                "updated = excluded.updated, detail = excluded.detail",
                _instance_row(record),
            )
            detail = json.dumps({"instance": record.name, "state": record.state})
            db.execute(
                "INSERT INTO events (run, t, kind, detail) VALUES (?, ?, 'instance', ?)", (record.run, time.time(), detail)
            )

    def instances(self, run: str) -> list[InstanceRecord]:
        rows = self.db.execute(
            f"SELECT {INSTANCE_COLUMNS} FROM instances WHERE run = ? ORDER BY name",
            (run,),
        ).fetchall()
        return [_instance(row) for row in rows]

    # -- events ---------------------------------------------------------------------------------
    def event(self, run: str, kind: str, **detail: Any) -> None:
        self.db.execute(
            "INSERT INTO events (run, t, kind, detail) VALUES (?, ?, ?, ?)", (run, time.time(), kind, json.dumps(detail))
        )

    def events(self, run: str, limit: int = 100) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT t, kind, detail FROM events WHERE run = ? ORDER BY id DESC LIMIT ?", (run, limit)
        ).fetchall()
        return [{"t": t, "kind": kind, **json.loads(detail)} for t, kind, detail in reversed(rows)]


def _instance_row(r: InstanceRecord) -> tuple[Any, ...]:
    return (r.run, r.name, r.region, r.provider, r.role, r.state, r.provider_id, r.updated, json.dumps(r.detail))


def _run(row: tuple[Any, ...]) -> RunRecord:
    return RunRecord(id=row[0], created=row[1], state=row[2], regions_file=row[3], job_dir=row[4], detail=json.loads(row[5]))


def _instance(row: tuple[Any, ...]) -> InstanceRecord:
    names = ("run", "name", "region", "provider", "role", "state", "provider_id", "updated")
    return InstanceRecord(**dict(zip(names, row[:8], strict=True)), detail=json.loads(row[8]))
