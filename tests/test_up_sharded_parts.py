"""The parts of ``ddctl up`` with a sharded synchronizer, fast: the plan's shard processes, their commands, what up
refuses, the job's figures from its shards' (dashboard and result), and the controller's end of a sharded job.
The processes themselves run in ``test_up_sharded.py``."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.config.regions import Region, load_regions
from ddctl.control import shard_end
from ddctl.control.controller import Controller
from ddctl.control.finish import RunResult
from ddctl.control.plan import shard_map, syncer_shards
from ddctl.control.rundir import RunDir
from ddctl.control.specs import learner_spec, syncer_spec
from ddctl.control.state import InstanceRecord, State
from ddctl.dashboard.checked import checked_status
from ddctl.dashboard.render import event_line, global_lines, shard_lines
from ddctl.dashboard.sharded import job_status
from ddctl.dashboard.snapshot import RunRecords, SyncerView, build
from ddctl.errors import DdctlError
from ddctl.providers.base import InstanceSpec, RegionInfo
from ddctl.providers.fake import FakeProvider
from tests.test_runs import result

runner = CliRunner()
INFO = RegionInfo(region="west", provider="process", python="/usr/bin/python3", remote=False, syncer_host="127.0.0.1")
SHARDED = {
    "run": "r",
    "synchronizer": {"shards": 2},
    "training": {"preset": "tiny", "tokens": 100_000, "fragments": 4, "inner_steps": 8},
    "regions": [{"name": "east", "provider": "process", "learners": 1}, {"name": "west", "provider": "process", "learners": 1}],
}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    RunDir("r").job.mkdir(parents=True)
    (RunDir("r").job / "secret").write_text("ab" * 32 + "\n")
    return tmp_path / "home"


def regions(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump({**SHARDED, **changes}))
    return path


# -- the plan and the commands ----------------------------------------------------------------------------------


def test_each_shard_of_the_plan_is_a_syncer_process_in_its_region_serving_the_plans_map(tmp_path: Path) -> None:
    rf = load_regions(regions(tmp_path))
    shards = syncer_shards(rf)
    assert [(s.name, s.shard) for s in shards] == [("syncer", "S0"), ("syncer-s1", "S1")]
    assert rf.syncer == shards[0].region  # the first shard's region is the run's syncer region
    the_map = shard_map(rf)
    assert the_map.epoch == 1 and the_map.shards == ("S0", "S1") and sorted(set(the_map.owners)) == [0, 1]
    one = load_regions(regions(tmp_path, synchronizer={"shards": 1}))
    assert [(s.name, s.shard) for s in syncer_shards(one)] == [("syncer", "")]
    plain = load_regions(regions(tmp_path, synchronizer=None, syncer="west"))
    assert [(s.name, s.shard, s.region) for s in syncer_shards(plain)] == [("syncer", "", "west")]


def test_a_shards_command_names_its_shard_its_own_state_and_no_whole_model_work(home: Path) -> None:
    spec = syncer_spec("r", INFO, 9001, shard=("syncer-s1", "S1"))
    argv = list(spec.argv)
    assert spec.name == "syncer-s1" and spec.role == "syncer" and spec.log == RunDir("r").log("syncer-s1")
    assert argv[argv.index("--shard") + 1] == "S1"
    assert argv[argv.index("--shard-map") + 1] == str(RunDir("r").job / "shards.json")
    assert argv[argv.index("--state-dir") + 1] == str(RunDir("r").job / "state-S1") == str(RunDir("r").state("S1"))
    assert spec.summary == str(RunDir("r").state("S1") / "summary.json")
    assert float(argv[argv.index("--linger") + 1]) >= 300  # the controller joins the final model meanwhile
    assert argv[argv.index("--eval-every") + 1] == "0" and not any(a.startswith("--checkpoint") for a in argv)
    first = syncer_spec("r", INFO, 9000, shard=("syncer", "S0"))
    assert first.name == "syncer" and first.summary == str(RunDir("r").state() / "summary.json")
    alone = list(syncer_spec("r", INFO, 9000).argv)  # one synchronizer: as before
    assert "--shard" not in alone and "--state-dir" not in alone and "--checkpoint-every" in alone
    with pytest.raises(DdctlError, match=r"syncer-s1: a shard on a cloud VM \(aws\) needs an address of its own.* in w$"):
        syncer_spec("r", RegionInfo(region="w", provider="aws", python="python3", remote=True, syncer_host="10.0.0.2"), 9001,
                    shard=("syncer-s1", "S1"))  # fmt: skip


def test_a_learner_is_given_every_shards_address_in_shard_order(home: Path) -> None:
    argv = list(learner_spec("r", INFO, Region(name="west", provider="process"), "L1", (9000, 9001)).argv)
    urls = [argv[i + 1] for i, a in enumerate(argv) if a == "--syncer"]
    assert urls == ["https://127.0.0.1:9000", "https://127.0.0.1:9001"]


def test_on_docker_vms_each_shard_has_an_address_of_its_own_and_a_disk_of_its_own(home: Path) -> None:
    from ddctl.providers.base import syncer_index, syncer_name
    from ddctl.providers.deploy import REMOTE_ROOT

    vm = RegionInfo(region="west", provider="docker", python="python3", remote=True, syncer_host="10.213.4.250",
                    shard_addresses=True)  # fmt: skip
    assert [vm.shard_host(i) for i in range(3)] == ["10.213.4.250", "10.213.4.249", "10.213.4.248"]
    assert INFO.shard_host(2) == "127.0.0.1"  # local processes: one host, a port each
    assert [syncer_index(syncer_name(i)) for i in range(12)] == list(range(12)) and syncer_index("L3") == 0
    argv = list(learner_spec("r", vm, Region(name="west", provider="docker"), "L1", (8443, 8443)).argv)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--syncer"] == [
        "https://10.213.4.250:8443",
        "https://10.213.4.249:8443",
    ]
    (RunDir("r").job / "shards.json").write_text("{}")
    spec = syncer_spec("r", vm, 8443, shard=("syncer-s1", "S1"))
    assert (
        spec.disks == {f"{REMOTE_ROOT}/state": str(RunDir("r").disk("S1"))} and RunDir("r").disk("S1").name == "syncer-state-S1"
    )
    assert spec.files[f"{REMOTE_ROOT}/job/shards.json"] == str(RunDir("r").job / "shards.json")
    assert syncer_spec("r", vm, 8443).disks == {f"{REMOTE_ROOT}/state": str(RunDir("r").disk())}


def test_a_resumed_sharded_run_starts_every_shard_from_the_checkpoint_and_none_checkpoints_on_its_own(home: Path) -> None:
    from ddctl.config.regions import Checkpoints
    from ddctl.providers.deploy import REMOTE_ROOT

    RunDir("r").resume.mkdir()
    (RunDir("r").resume / "manifest.json").write_text("{}")
    (RunDir("r").job / "shards.json").write_text("{}")
    vm = RegionInfo(region="west", provider="docker", python="python3", remote=True, syncer_host="10.213.4.250",
                    shard_addresses=True)  # fmt: skip
    for info, job in ((INFO, str(RunDir("r").job)), (vm, f"{REMOTE_ROOT}/job")):
        for shard in (("syncer", "S0"), ("syncer-s1", "S1")):
            spec = syncer_spec("r", info, 9000, None, Checkpoints(every_rounds=5, url="s3://bucket/ckpt"), shard)
            argv = list(spec.argv)
            assert argv[argv.index("--resume-from") + 1] == f"{job}/resume", (info.provider, shard)
            assert not any(a.startswith("--checkpoint") for a in argv)  # the controller takes a sharded run's checkpoints
            if info.remote:
                assert spec.files[f"{job}/resume/manifest.json"] == str(RunDir("r").resume / "manifest.json")


def test_a_sharded_runs_schedule_is_its_checkpoints_section_and_counts_the_rounds_every_shard_merged() -> None:
    from ddctl.config.regions import Checkpoints
    from ddctl.control.run_checkpoints import job_rounds, policy_for

    policy = policy_for(Checkpoints(every_rounds=8, every_minutes=1.5, keep_last=2, keep_every=5, url="s3://b/p"), "r")
    assert (policy.every_rounds, policy.every_s, policy.keep_last, policy.keep_every, policy.url) == (8, 90.0, 2, 5, "s3://b/p/r")
    assert policy_for(Checkpoints(), "r").url == "" and policy_for(Checkpoints(), "r").every_s == 600.0
    assert job_rounds([("https://a", {"rounds": 7}, ""), ("https://b", {"rounds": 5}, "")]) == 12
    for answer, words in (
        ((None, "ConnectError: refused"), "shard https://b did not answer: ConnectError: refused"),
        (({"rounds": "7"}, ""), "shard https://b answered rounds='7'; a count (an integer >= 0) was expected"),
        (({"rounds": -1}, ""), "answered rounds='-1'"),
        (({"rounds": True}, ""), "answered rounds='True'"),
        (({}, ""), "answered rounds='None'"),
    ):
        with pytest.raises(DdctlError, match=re.escape(words)):
            job_rounds([("https://a", {"rounds": 7}, ""), ("https://b", *answer)])


class Answers:
    """A shard's client that answers status with what it is given (or fails), and counts what it was asked."""

    def __init__(self, status: dict[str, Any] | Exception) -> None:
        self.answer, self.asked = status, 0

    def status(self) -> dict[str, Any]:
        self.asked += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def close(self) -> None:
        pass


def test_a_look_takes_a_checkpoint_only_when_due_and_a_failing_one_is_recorded_once_not_raised(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddctl.control.run_checkpoints import RunCheckpoints
    from ddctl_agents.agent.client import Unavailable
    from ddctl_agents.service.checkpoints import CheckpointPolicy

    state = State()
    state.create_run("r", "regions.yaml", str(RunDir("r").job), {})
    shards = {"https://a": Answers({"rounds": 3}), "https://b": Answers({"rounds": 4})}
    schedule = RunCheckpoints("r", state, CheckpointPolicy(every_rounds=10, every_s=0), list(shards), shards.__getitem__,
                              assembly=None, root=RunDir("r").global_checkpoints, last_at=0.0)  # fmt: skip
    taken: list[float] = []
    monkeypatch.setattr(RunCheckpoints, "take", lambda self, now: taken.append(now) or {"name": "ckpt-000001"})
    assert schedule.look(1.0) is None and taken == [] and all(c.asked == 1 for c in shards.values())  # 7 rounds: not due
    shards["https://b"].answer = {"rounds": 7, "job": {"phase": "finishing"}}
    assert schedule.look(2.0) is None and taken == []  # 10 rounds, but the job's end takes the final model
    shards["https://b"].answer = {"rounds": 7, "job": {"phase": "training"}}
    assert schedule.look(2.0) == {"name": "ckpt-000001"} and taken == [2.0]
    shards["https://b"].answer = Unavailable("https://b: connection refused")
    assert schedule.look(3.0) is None and schedule.look(4.0) is None and taken == [2.0]
    errors = [e for e in state.events("r") if e["kind"] == "error"]
    assert len(errors) == 1 and errors[0]["where"] == "checkpoints" and "connection refused" in errors[0]["message"]
    figures = state.run("r").detail["checkpoints"]  # type: ignore[union-attr]
    assert "connection refused" in figures["error"] and figures["taken"] == 0
    shards["https://a"].answer = {"rounds": 3, "job": {"phase": "finishing"}}  # one finishing, one gone: the end's
    shards["https://b"].answer = Unavailable("https://b: gone, its job over")
    assert schedule.look(5.0) is None and len([e for e in state.events("r") if e["kind"] == "error"]) == 1  # no new one
    RunDir("r").final.mkdir(parents=True)
    (RunDir("r").final / "manifest.json").write_text("{}")  # the job's end took its final model: the schedule is over
    asked = [c.asked for c in shards.values()]
    assert schedule.look(6.0) is None and [c.asked for c in shards.values()] == asked
    taken_event = {"t": 1.0, "event": "checkpoint", "name": "ckpt-000002", "cut": 2, "rounds": 24, "val_bpb": 3.91234,
                   "bytes": 2_400_000, "seconds": 1.234}  # fmt: skip
    assert event_line(taken_event).plain.endswith("checkpoint ckpt-000002: round 24, val_bpb 3.9123, 2.4 MB in 1.2s")
    unevaluated = event_line(taken_event | {"val_bpb": None}).plain  # a field not of its kind: every field, no crash
    assert "name=ckpt-000002" in unevaluated and "rounds=24" in unevaluated and "val_bpb" not in unevaluated


# -- the job's figures from its shards' ---------------------------------------------------------------------------


def shard(name: str, owned: list[int], versions: list[int], phase: str = "training", **changes: Any) -> dict[str, Any]:
    ledger = {"received": 100, "merged": 80, "late_merged": 10, "dropped": 5, "rejected": 0, "pending": 5, "balanced": True}
    return {
        "run": "r", "fragments": 4, "quorum": 1, "grace": True, "parameters": 1000, "rounds": 7, "versions": versions,
        "uptime_s": 10.0, "quorum_s": 9.0, "bytes_up": 1000, "bytes_down": 3000, "live": ["L0"], "learners": [],
        "tokens": {"budget": 500, "planned": 480, "trained": 300, "received": 25, "merged": 20, "late_merged": 2,
                   "dropped": 1, "pending": 2, "rejected": 0},
        "ledger": ledger, "job": {"phase": phase, "reason": ""}, "degraded": [], "suspended": [],
        "recent_rounds": [{"t": 5.0 + len(name), "fragment": owned[0], "version": 1, "cause": "all_arrived"}],
        "events": [{"t": 1.0, "event": "started", "snapshot": False}],
        "site": {"name": name.lower(), "up_mbps": 10.0, "down_mbps": None},
        "shard": {"name": name, "epoch": 1, "shards": ["S0", "S1"], "owned": owned},
    } | changes  # fmt: skip


def test_the_dashboard_draws_the_job_from_its_shards_books_added_learners_once_versions_by_owner() -> None:
    s0 = shard("S0", [0, 2], [3, 0, 5, 0])
    s1 = shard("S1", [1, 3], [0, 4, 0, 6], rounds=9, tokens={**s0["tokens"], "trained": 310, "merged": 30})
    job = job_status([("u0", s0, ""), ("u1", s1, "")])
    assert job is not None and job["rounds"] == 16 and job["versions"] == [3, 4, 5, 6]
    assert job["ledger"] == {"received": 200, "merged": 160, "late_merged": 20, "dropped": 10, "rejected": 0, "pending": 10,
                             "balanced": True}  # fmt: skip
    assert job["tokens"]["merged"] == 50 and job["tokens"]["trained"] == 310 and job["tokens"]["budget"] == 500
    assert job["bytes_up"] == 2000 and job["bytes_down"] == 6000 and job["site"] is None
    assert [e["shard"] for e in job["events"]] == ["S0", "S1"] and [r["t"] for r in job["recent_rounds"]] == [7.0, 7.0]
    assert [row["shard"] for row in job["shards"]] == ["S0", "S1"] and job["job"]["phase"] == "training"
    unbalanced = job_status([("u0", s0, ""), ("u1", s1 | {"ledger": {**s1["ledger"], "balanced": False}}, "")])
    assert unbalanced is not None and unbalanced["ledger"]["balanced"] is False


def test_a_fragment_in_the_middle_of_a_handoff_shows_the_newest_version_any_shard_holds() -> None:
    """S1 handed fragment 1 out at version 16 and S0 has not taken it in (its copy: 0): owned by neither for a moment.
    A CI run drew it at S0's 0, the first shard's, while both shards' books said 16."""
    s0 = shard("S0", [0, 2], [16, 0, 16, 0])
    s1 = shard("S1", [3], [0, 16, 0, 16], shard={"name": "S1", "epoch": 2, "shards": ["S0", "S1"], "owned": [3]})
    for answers in ([("u0", s0, ""), ("u1", s1, "")], [("u1", s1, ""), ("u0", s0, "")]):
        job = job_status(answers)
        assert job is not None and job["versions"] == [16, 16, 16, 16]
    odd = shard("S1", [3], [0, None, 0, 16], shard={"name": "S1", "epoch": 2, "shards": ["S0", "S1"], "owned": [3]})
    job = job_status([("u0", s0, ""), ("u1", odd, "")])  # what is not a count is not the newest
    assert job is not None and job["versions"] == [16, 0, 16, 16]


@pytest.mark.parametrize(
    ("phases", "missing", "expected"),
    [(("finished", "finished"), False, "finished"), (("finished", "training"), False, "finishing"),
     (("training", "training"), False, "training"), (("finished", "finished"), True, "finishing")],
)  # fmt: skip
def test_the_job_has_finished_when_every_shard_has(phases: tuple[str, str], missing: bool, expected: str) -> None:
    answers: list[tuple[str, dict[str, Any] | None, str]] = [
        ("u0", shard("S0", [0, 2], [1, 0, 1, 0], phases[0]), ""),
        ("u1", None if missing else shard("S1", [1, 3], [0, 1, 0, 1], phases[1]), "refused" if missing else ""),
    ]
    job = job_status(answers)
    assert job is not None and job["job"]["phase"] == expected
    assert job_status([("u0", None, "down"), ("u1", None, "down")]) is None


def test_the_dashboard_draws_a_line_per_shard_and_says_which_shard_said_an_event() -> None:
    s0 = shard("S0", [0, 2], [3, 0, 5, 0])
    job = job_status([("https://h:1", s0, ""), ("https://h:2", None, "connection refused")])
    assert job is not None
    lines = [line.plain for line in shard_lines(job)]
    assert lines[0].startswith("S0 s0 · f0v3 f2v5 · rounds 7 · balanced · training · site 10.0 / — Mbit/s")
    assert lines[1] == "shard at https://h:2: not answering (connection refused)"
    assert event_line(job["events"][0]).plain.endswith("S0: syncer started on a fresh state")


def test_the_fragments_of_a_shard_not_answering_show_as_unknown_not_as_another_shards_stale_copy() -> None:
    """S0's map says S1 owns fragments 1 and 3; S1 is down. S0's copies of them (0) are no one's version."""
    s0 = shard("S0", [0, 2], [3, 0, 5, 0], shard={"name": "S0", "epoch": 1, "shards": ["S0", "S1"], "owned": [0, 2],
                                                  "owners": [0, 1, 0, 1]})  # fmt: skip
    job = job_status([("https://h:1", s0, ""), ("https://h:2", None, "connection refused")])
    assert job is not None and job["versions"] == [3, None, 5, None]
    snapshot = build(RunRecords(run="r", provider="local", instances=[]), SyncerView(checked_status(job), 0.0), 0.0)
    assert global_lines(snapshot, 120)[0].plain.startswith("P=4 versions 3..5 (2 unknown) · K=1 grace on")
    every = job_status([("https://h:1", s0, ""), ("https://h:2", shard("S1", [1, 3], [0, 4, 0, 6]), "")])
    assert every is not None and every["versions"] == [3, 4, 5, 6]
    drawn = build(RunRecords(run="r", provider="local", instances=[]), SyncerView(checked_status(every), 0.0), 0.0)
    assert global_lines(drawn, 120)[0].plain.startswith("P=4 versions 3..6 · K=1")


# -- the end of a sharded job --------------------------------------------------------------------------------------


def test_a_sharded_jobs_result_is_its_shards_books_added_with_its_joined_models_val_bpb() -> None:
    a = RunResult.model_validate(result(rounds=10, checkpoint=None, bytes_up=1, learners_finished=["L0"]))
    tokens = {**result()["tokens"], "merged": 100, "trained": 970}
    b = RunResult.model_validate(result(rounds=12, checkpoint=None, tokens=tokens, goodput=0.7, learners_finished=["L1"]))
    job = shard_end.joined([a, b], 3.25, "/runs/r/final")
    assert job.rounds == 22 and job.tokens.merged == 1000 and job.tokens.trained == 970 and job.tokens.budget == 1000
    assert job.val_bpb == 3.25 and job.checkpoint == "/runs/r/final" and job.learners_finished == ["L0", "L1"]
    assert job.bytes_up == 11 and job.bytes_down == 40 and job.goodput == 0.7


def test_the_controller_ends_a_sharded_job_once_every_shard_has_its_result(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = State()
    state.create_run("r", str(regions(tmp_path, checkpoints={"keep_last": 2, "every_minutes": 5})), str(RunDir("r").job), {})
    state.set_run_state("r", "training")
    fake = FakeProvider()
    for name, shard_name in (("syncer", "S0"), ("syncer-s1", "S1")):
        spec = InstanceSpec(run="r", name=name, region="eu", role="syncer", argv=("agent",), log=tmp_path / name,
                            summary=f"/state-{shard_name}/summary.json")  # fmt: skip
        started = fake.create(spec)
        state.put_instance(InstanceRecord("r", name, "eu", "fake", "syncer", "running", started.provider_id, time.time(),
                                          {"spec": spec.to_json()}))  # fmt: skip
    joins: list[str] = []
    policies: list[Any] = []

    def final_model(run: str, policy: Any) -> dict[str, Any]:
        joins.append(run)
        policies.append(policy)
        return {"path": "/final", "val_bpb": 3.123456}

    monkeypatch.setattr(shard_end, "final_model", final_model)
    controller = Controller("r", state, owners={"fake": fake})
    fake.write_summary("r", "syncer-s1", json.dumps(result(rounds=5, checkpoint=None)).encode())
    controller.once()
    assert joins == [] and state.run("r").state == "training"  # type: ignore[union-attr]  # S0 has not ended yet
    fake.write_summary("r", "syncer", json.dumps(result(rounds=7, checkpoint=None)).encode())
    assert controller.once() == []
    record = state.run("r")
    assert joins == ["r"] and record is not None and record.state == "finished"
    assert [(p.every_s, p.keep_last, p.url) for p in policies] == [(300.0, 2, "")]  # the run's schedule keeps its final
    summary = record.detail["summary"]
    assert summary["rounds"] == 12 and summary["val_bpb"] == 3.12346 and summary["result"] == "/final"
    assert summary["tokens"]["merged"] == 1800 and summary["tokens"]["trained"] == 960
    assert fake.list_run("r") == []


def test_the_re_planners_looks_and_re_plans_are_recorded_with_the_run_as_it_saw_them(home: Path) -> None:
    from ddctl.control.run_replanning import RunReplanner
    from ddctl.dashboard.render import replanner_text

    state = State()
    state.create_run("r", "regions.yaml", str(RunDir("r").job), {})
    replanner = RunReplanner("r", state, replanning=None)  # type: ignore[arg-type]  # record() does not look
    replanner.record({"t": 1.0, "utilisation": 0.8123, "best": 0.5, "streak": 2, "replan": None})
    look = state.run("r").detail["replanner"]  # type: ignore[union-attr]
    assert (look["utilisation"], look["best"], look["streak"], look["replans"], look["error"]) == (0.8123, 0.5, 2, 0, None)
    assert replanner_text(look) == "busiest site 81.2% of its link, best placement 50.0% (seen 2x) · 0 re-plan(s)"
    moves = [{"fragment": 3, "from": "a", "to": "b", "shard": "S1", "seconds": 0.41},
             {"fragment": 5, "from": "a", "to": "b", "shard": "S1", "error": "S0 did not answer"}]  # fmt: skip
    made = {"cause": "site a predicted at 81% of its link; 50% after moving 2", "before": 0.81, "after": 0.5, "moves": moves}
    replanner.record({"t": 2.0, "utilisation": 0.5, "best": 0.5, "streak": 0, "replan": made})
    replanner.record({"t": 3.0, "error": "ConnectError: refused"})
    look = state.run("r").detail["replanner"]  # type: ignore[union-attr]
    assert look["replans"] == 1 and look["error"] == "ConnectError: refused"
    assert replanner_text(look) == "could not look (ConnectError: refused); 1 re-plan(s) so far"
    replanner.record({"t": 4.0, "epoch": 2, "finished": [], "skipped": "the job is finishing"})
    look = state.run("r").detail["replanner"]  # type: ignore[union-attr]
    assert (look["replans"], look["error"], look["skipped"], look["utilisation"]) == (1, None, "the job is finishing", None)
    assert replanner_text(look) == "not deciding (the job is finishing); 1 re-plan(s) so far"
    replanner.record({"t": 5.0, "utilisation": 0.4, "best": 0.2, "streak": 0, "floor": 0.5, "replan": None})
    look = state.run("r").detail["replanner"]  # type: ignore[union-attr]
    assert look["floor"] == 0.5 and look["skipped"] is None
    assert replanner_text(look) == (
        "busiest site 40.0% of its link, best placement 20.0% (seen 0x; nothing moves under 50.0%) · 1 re-plan(s)"
    )
    replanner.record({"t": 6.0, "utilisation": 0.5, "best": 0.2, "streak": 1, "floor": 0.5, "replan": None})
    look = state.run("r").detail["replanner"]  # type: ignore[union-attr]
    assert replanner_text(look) == "busiest site 50.0% of its link, best placement 20.0% (seen 1x) · 1 re-plan(s)"
    [event] = [e for e in state.events("r") if e["kind"] == "replan"]
    assert event["moves"] == "f3 a->b (S1, 0.41s), f5 a->b (S1, -s; failed: S0 did not answer)"
    assert event["cause"] == made["cause"] and (event["before"], event["after"]) == (0.81, 0.5)
    line = event_line({"t": 2.0, "event": "replan", "moves": event["moves"], "cause": event["cause"]}).plain
    assert line.endswith(f"re-plan: {event['moves']}: {made['cause']}")


@pytest.mark.parametrize("command", ["status", "checkpoint", "move"])
def test_the_shard_commands_take_a_job_dir_with_its_shards_or_a_sharded_run(command: str, tmp_path: Path, home: Path) -> None:
    extra = {"status": [], "checkpoint": ["--out", str(tmp_path / "ckpt")], "move": ["--fragment", "1", "--to", "S0"]}[command]
    neither = runner.invoke(app, ["syncer", command, *extra])
    assert neither.exit_code == 2 and "give the job directory and every shard's --syncer URL, or --run RUN" in neither.output
    both = runner.invoke(app, ["syncer", command, str(tmp_path), "--syncer", "https://h:1", "--run", "r", *extra])
    assert both.exit_code == 2 and "or --run RUN, not both" in both.output
    lone = runner.invoke(app, ["syncer", command, "--run", "r", *extra])  # a run with one synchronizer
    assert lone.exit_code == 2 and "run r has no sharded synchronizer here" in lone.output
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize(
    "bad",
    [
        {"rounds": "many"},
        {"ledger": None},
        {"versions": [1]},
        {"shard": {"name": "S1", "owned": [9]}},
        {"tokens": {"merged": "x"}},
    ],
)
def test_a_shard_status_that_does_not_add_up_is_an_error_on_the_dashboard_not_a_crash(
    bad: dict[str, Any], home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddctl.dashboard import watch

    RunDir("r").shard_urls.write_text("https://h:1\nhttps://h:2\n")
    good = shard("S0", [0, 2], [3, 0, 5, 0])
    monkeypatch.setattr(watch, "gather", lambda urls, connect: [(urls[0], good, ""), (urls[1], {**good, **bad}, "")])
    view = watch.ask_syncer("r")
    assert view.status is None and view.error is not None and view.error.startswith("a shard's status is malformed (")
    monkeypatch.setattr(watch, "gather", lambda urls, connect: [(urls[0], good, ""), (urls[1], None, "refused")])
    partial = watch.ask_syncer("r")  # one shard down: the job from the other, and which one did not answer
    assert partial.status is not None and partial.error == "1 of 2 shards did not answer (https://h:2: refused)"
