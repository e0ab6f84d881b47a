"""The local SQLite state: runs, instances and events survive reopening; changes are atomic."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from ddctl.control.rundir import data_dir
from ddctl.control.state import InstanceRecord, State


def instance(run: str, name: str, state: str = "running") -> InstanceRecord:
    return InstanceRecord(run, name, "eu", "process", "learner", state, f"pid-{name}", time.time(), {"port": 1})


def test_runs_instances_and_events_persist(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    with State(path) as state:
        state.create_run("r1", "regions.yaml", "/jobs/r1", {"learners": 2})
        state.put_instance(instance("r1", "L0"))
        state.put_instance(instance("r1", "L0", "preempted"))  # an update, not a second row
        state.event("r1", "chaos", region="eu")
        state.set_run_state("r1", "training")
    with State(path) as again:
        run = again.run("r1")
        assert run is not None and (run.state, run.detail) == ("training", {"learners": 2})
        [l0] = again.instances("r1")
        assert (l0.state, l0.provider_id, l0.detail) == ("preempted", "pid-L0", {"port": 1})
        kinds = [e["kind"] for e in again.events("r1")]
        assert kinds == ["run-created", "instance", "instance", "chaos", "run-training"]
        again.delete_run("r1")
        assert again.run("r1") is None and again.instances("r1") == [] and again.events("r1") == []


def test_a_failed_transaction_leaves_nothing(tmp_path: Path) -> None:
    with State(tmp_path / "s.sqlite3") as state:
        state.create_run("r1", "f", "d")
        with pytest.raises(sqlite3.IntegrityError):
            state.create_run("r1", "f", "d")  # the duplicate's event row must not land either
        assert [e["kind"] for e in state.events("r1")] == ["run-created"]
        with pytest.raises(sqlite3.IntegrityError):
            state.put_instance(instance("no-such-run", "L0"))
        assert state.instances("no-such-run") == []


def test_the_data_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    assert data_dir() == tmp_path / "home"
    monkeypatch.delenv("DDCTL_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "ddctl"
