"""Runs as objects: choosing one, listing them, ending one (the controller's side), down and gc from the CLI.

Fast: a real SQLite state file and the fake provider; the end-to-end runs are in
``test_up.py`` and ``test_up_docker.py``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.control.controller import Controller
from ddctl.control.down import down, report
from ddctl.control.finish import parse_result
from ddctl.control.rundir import RunDir
from ddctl.control.runs import NoSuchRun, choose_run, dollars_so_far, list_runs, purge
from ddctl.control.state import InstanceRecord, State
from ddctl.errors import DdctlError
from ddctl.providers.base import InstanceSpec
from ddctl.providers.fake import FakeProvider

runner = CliRunner()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def make_run(state: State, run: str, run_state: str, **detail: Any) -> None:
    state.create_run(run, "regions.yaml", str(RunDir(run).job), detail)
    if run_state != "starting":
        state.set_run_state(run, run_state)


def result(**changes: Any) -> dict[str, Any]:
    tokens = {"budget": 1000, "planned": 960, "trained": 960, "received": 960, "merged": 900, "late_merged": 60,
              "dropped": 0, "rejected": 0, "pending": 0}  # fmt: skip
    return {
        "run": "r", "reason": "every learner trained its share of the token budget", "finished_at": 1.0e9,
        "uptime_s": 60.0, "quorum_s": 58.0, "goodput": 0.8, "rounds": 40, "versions": [10, 10], "tokens": tokens,
        "val_bpb": 3.5, "bytes_up": 10, "bytes_down": 20, "learners_finished": ["L0", "L1"], "snapshot_bytes": 5,
        "state_dir": "/opt/ddctl/state", **changes,
    }  # fmt: skip


# -- choosing a run -----------------------------------------------------------------------------------


def test_the_only_live_run_is_the_default_and_anything_else_is_an_error_that_lists_the_runs(home: Path) -> None:
    with State() as state:
        with pytest.raises(NoSuchRun, match="no run is live; start one with: ddctl up --dry-run$"):
            choose_run(state)
        make_run(state, "old", "down")
        make_run(state, "a", "training")
        assert choose_run(state) == "a"  # ended runs do not compete
        assert choose_run(state, "old") == "old"  # but can be named
        make_run(state, "b", "kept")  # finished, machines kept: still live
        with pytest.raises(NoSuchRun, match=r"2 runs are live: a \(training\); b \(kept\); pick one with --run NAME"):
            choose_run(state)
        with pytest.raises(NoSuchRun, match=r"no run named 'c'; runs: old \(down\); a \(training\); b \(kept\)"):
            choose_run(state, "c")


def test_every_command_that_needs_a_run_says_which_exist(home: Path) -> None:
    with State() as state:
        make_run(state, "a", "training")
        make_run(state, "b", "training")
    for command in (["status"], ["logs"], ["stop"], ["chaos", "preempt", "east"], ["syncer", "readmit", "L0"]):
        out = runner.invoke(app, command)
        assert out.exit_code == 2 and "2 runs are live: a (training); b (training); pick one with --run" in out.output, (
            command,
            out.output,
        )


# -- ls, the cost so far, gc ----------------------------------------------------------------------


def test_ls_lists_runs_with_their_state_regions_age_and_cost(home: Path) -> None:
    with State() as state:
        make_run(state, "a", "training", kinds={"east": "fake", "west": "fake"}, dollars_per_hour=1.5)
        make_run(state, "b", "down", kinds={"east": "fake"}, dollars_per_hour=None)
        record = state.run("a")
        assert record is not None
        assert dollars_so_far(record, record.created + 7200) == 3.0  # $1.50/h for two hours
        rows = {r.run: r for r in list_runs(state, now=record.created + 60)}
    assert rows["a"].state == "training" and rows["a"].regions == ["east", "west"] and rows["a"].age_s == 60.0
    assert rows["b"].dollars_so_far is None and rows["b"].instances_up == 0  # unpriced: no number rather than a wrong one
    listed = runner.invoke(app, ["ls", "--json"])
    assert listed.exit_code == 0 and [r["run"] for r in json.loads(listed.stdout)["runs"]] == ["a", "b"]
    table = runner.invoke(app, ["ls"])
    assert table.exit_code == 0 and "training" in table.stdout and "east,west" in table.stdout and "1.50" in table.stdout
    assert "plan $/h" in table.stdout  # the plan's rate, egress included: not status's machines on the bill


def test_an_ended_run_stops_costing_when_it_ended(home: Path) -> None:
    with State() as state:
        make_run(state, "a", "finished", dollars_per_hour=2.0)
        record = state.run("a")
        assert record is not None
        state.update_run_detail("a", {"ended_at": record.created + 1800})
        assert dollars_so_far(state.run("a"), record.created + 99_999) == 1.0  # type: ignore[arg-type]
        make_run(state, "k", "kept", dollars_per_hour=3600.0)  # $1 a second: finished, its machines kept
        kept = state.run("k")
        assert kept is not None
        state.update_run_detail("k", {"ended_at": kept.created + 10})
        rows = {r.run: r for r in list_runs(state, now=record.created + 99_999)}
        assert rows["a"].dollars_per_hour == 0.0 and rows["a"].dollars_so_far == 1.0  # it holds no machine now
        assert rows["k"].dollars_per_hour == 3600.0  # its machines were kept: they still cost, past the job's end
        assert dollars_so_far(state.run("k"), kept.created + 50) == 50.0  # type: ignore[arg-type]
        before = time.time()
        down("k", state, owners=[])  # removes them: the bill stops there
        released = state.run("k")
        assert released is not None and released.state == "down"
        assert before <= released.detail["released_at"] <= time.time()
        later = dollars_so_far(released, released.detail["released_at"] + 99_999)
        assert later == round(3600.0 * (released.detail["released_at"] - kept.created) / 3600, 4)


def test_gc_deletes_ended_runs_directories_and_never_a_live_one(home: Path) -> None:
    with State() as state:
        make_run(state, "live", "training")
        make_run(state, "done", "finished")
        for run in ("live", "done", "done.20261130T120000"):  # the last: an older life of "done", set aside by up
            (home / "runs" / run / "job").mkdir(parents=True)
            (home / "runs" / run / "job" / "secret").write_bytes(b"x" * 1000)
        purged = purge(state)
        assert sorted(Path(item["path"]).name for item in purged["removed"]) == ["done", "done.20261130T120000"]
        assert purged["bytes"] == 2000 and state.run("done") is None and state.run("live") is not None
    assert (home / "runs" / "live" / "job" / "secret").exists()
    again = runner.invoke(app, ["gc"])
    assert again.exit_code == 0 and "no ended run left anything to delete" in again.stdout


def test_down_with_nothing_running_is_a_no_op_twice_and_down_purge_cleans_up(home: Path) -> None:
    for _ in range(2):
        out = runner.invoke(app, ["down"])
        assert out.exit_code == 0 and out.stdout.strip() == "nothing is running: nothing to remove"
    named = runner.invoke(app, ["down", "--run", "never-existed", "--json"])  # labels are searched even so
    assert named.exit_code == 0 and json.loads(named.stdout) == {"run": "never-existed", "removed": {}}
    with State() as state:
        make_run(state, "done", "down")
    (home / "runs" / "done").mkdir(parents=True)
    purged = runner.invoke(app, ["down", "--purge"])
    assert purged.exit_code == 0 and "nothing to remove" in purged.stdout and "deleted" in purged.stdout
    assert not (home / "runs" / "done").exists()


def test_down_reports_exactly_what_it_removed_by_kind() -> None:
    removed = {"learner": ["L0", "L1", "L2"], "syncer": ["syncer"], "network": ["ddctl-r-east"]}
    assert report({"run": "r", "removed": removed}) == (
        "r: removed 3 learners (L0, L1, L2); 1 syncer (syncer); 1 network (ddctl-r-east)"
    )
    assert report({"run": "r", "removed": {}}) == "r: nothing to remove"


# -- the job's end, on the laptop -------------------------------------------------------------------


def test_a_syncer_summary_is_checked_like_any_answer_from_another_process() -> None:
    assert parse_result(None) is None
    assert parse_result(json.dumps(result()).encode()).tokens.merged == 900  # type: ignore[union-attr]
    nan = parse_result(json.dumps(result(val_bpb=float("nan"))).encode())
    assert nan is not None and nan.val_bpb is None  # a number that is not one is shown as none, not as NaN
    with pytest.raises(DdctlError, match="malformed at tokens.merged: Input should be greater than or equal to 0"):
        parse_result(json.dumps(result(tokens={**result()["tokens"], "merged": -5})).encode())
    with pytest.raises(DdctlError, match="malformed at reason"):
        parse_result(json.dumps(result(reason="x" * 5000)).encode())
    with pytest.raises(DdctlError, match="not JSON"):
        parse_result(b'{"run": "r", "rea')


@pytest.fixture
def world(tmp_path: Path, home: Path) -> tuple[State, FakeProvider, Controller]:
    state = State()
    make_run(state, "r", "training", dollars_per_hour=3.6)
    fake = FakeProvider()
    for name, role in (("syncer", "syncer"), ("L0", "learner"), ("L1", "learner")):
        summary = "/opt/ddctl/state/summary.json" if role == "syncer" else "/s.json"
        spec = InstanceSpec(run="r", name=name, region="eu", role=role, argv=("agent",), log=tmp_path / name, summary=summary)
        started = fake.create(spec)
        state.put_instance(
            InstanceRecord("r", name, "eu", "fake", role, "running", started.provider_id, time.time(), {"spec": spec.to_json()})
        )
    return state, fake, Controller("r", state, owners={"fake": fake})


def test_when_the_syncer_writes_its_result_the_controller_records_it_and_removes_every_machine(
    world: tuple[State, FakeProvider, Controller],
) -> None:
    state, fake, controller = world
    assert controller.once() == []
    fake.end("r", "L0", summary=json.dumps({"reason": "finished"}).encode())
    fake.end("r", "L1", summary=json.dumps({"reason": "finished"}).encode())
    controller.once()  # both retired, neither replaced: they are done
    fake.write_summary("r", "syncer", json.dumps(result()).encode())
    assert controller.once() == []
    record = state.run("r")
    assert record is not None and record.state == "finished"
    summary = record.detail["summary"]
    assert summary["val_bpb"] == 3.5 and summary["tokens"]["merged"] == 900 and summary["result"] == "/opt/ddctl/state"
    assert summary["dollars"] is not None and summary["dollars"] >= 0
    assert fake.list_run("r") == []  # nothing left to bill
    assert any(e["kind"] == "finished" and e["val_bpb"] == 3.5 for e in state.events("r"))


@pytest.mark.parametrize("answers", [True, False])
def test_a_cloud_syncers_tape_comes_home_before_its_vm_goes_and_a_missing_one_is_said(
    world: tuple[State, FakeProvider, Controller], answers: bool
) -> None:
    """``ddctl replay --run`` of a run whose synchronizer ran on a cloud VM: the tape is copied to its disk's place."""
    state, fake, controller = world
    record = next(r for r in state.instances("r") if r.name == "syncer")
    spec = dataclasses.replace(InstanceSpec.from_json(record.detail["spec"]), disks={"/opt/ddctl/state": str(RunDir("r").disk())})
    state.put_instance(dataclasses.replace(record, detail={**record.detail, "spec": spec.to_json()}))
    tape = b'{"type":"header"}\n{"type":"round"}\n'
    if answers:
        fake.write_file("r", "syncer", "/opt/ddctl/state/tape.jsonl", tape)
    fake.write_summary("r", "syncer", json.dumps(result()).encode())
    controller.once()
    finished = state.run("r")
    assert finished is not None and finished.state == "finished" and fake.list_run("r") == []  # concluded either way
    said = [e for e in state.events("r") if e["kind"] == "error" and "its tape stays on its VM" in e.get("reason", "")]
    if answers:
        assert RunDir("r").tapes() == [RunDir("r").disk() / "tape.jsonl"] and RunDir("r").tapes()[0].read_bytes() == tape
        assert said == [] and not list(RunDir("r").disk().glob("*.part"))
    else:
        assert len(said) == 1 and said[0]["instance"] == "syncer"
        with pytest.raises(DdctlError, match="has no synchronizer tape"):
            RunDir("r").tapes()


def test_with_keep_the_machines_stay_and_the_run_is_kept_until_down(world: tuple[State, FakeProvider, Controller]) -> None:
    state, fake, controller = world
    state.update_run_detail("r", {"keep": True})
    fake.write_summary("r", "syncer", json.dumps(result()).encode())
    controller.once()
    record = state.run("r")
    assert record is not None and record.state == "kept" and record.detail["summary"]["rounds"] == 40
    assert sorted(i.name for i in fake.list_run("r")) == ["L0", "L1", "syncer"]


def test_a_malformed_result_is_refused_and_nothing_is_torn_down(world: tuple[State, FakeProvider, Controller]) -> None:
    state, fake, controller = world
    fake.write_summary("r", "syncer", json.dumps(result(rounds="many")).encode())
    controller.once()  # refused as an error event: the pass goes on (it ended there, before any learner was handled)
    [said] = [e for e in state.events("r", 100) if e.get("kind") == "error"]
    assert said["instance"] == "syncer" and "malformed at rounds" in said["reason"]
    record = state.run("r")
    assert record is not None and record.state == "training" and len(fake.list_run("r")) == 3
