"""A job's end on the real service: the budget trained (or ``stop`` asked), the result written, the syncer gone.

Real syncer and learner processes over HTTP/2 with TLS; the only thing the
tests shorten is how long a finished syncer lingers before it exits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddctl_agents.agent.client import Refused
from ddctl_agents.core.ending import FINISHED, STOPPED, budget_trained, departed, drained
from ddctl_agents.service.ending import Ending, read_summary, write_summary
from tests.service_harness import Job, small_job


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    made: list[Job] = []
    yield made
    for job in made:
        job.stop_all()


def events(status: dict, kind: str) -> list[dict]:
    return [e for e in status["events"] if e["event"] == kind]


# -- the pure rules ---------------------------------------------------------------------------------


def test_the_budget_is_trained_only_when_every_slot_finished_and_nothing_waits() -> None:
    assert budget_trained({"L0", "L1"}, 2, live=(), pending=0)
    assert not budget_trained({"L0"}, 2, live=(), pending=0)  # one slot still owes its share
    assert not budget_trained({"L0", "L1"}, 2, live=("L1",), pending=0)  # L1 came back (a new life) and trains
    assert not budget_trained({"L0", "L1"}, 2, live=(), pending=5)  # a round still holds tokens
    assert not budget_trained(set(), 0, live=(), pending=0)  # a job with no learners never "finishes" by itself
    assert drained((), 0) and not drained(("L0",), 0) and not drained((), 1)


def test_a_learner_that_leaves_on_its_own_says_why_and_the_first_stop_reason_stands() -> None:
    assert departed(FINISHED) == "finished" and departed(STOPPED) == "stopped"
    assert departed("sigterm") == "left" and departed("preempted") == "left"
    ending = Ending()
    assert ending.begin(10.0, "stopped by the operator")
    assert not ending.begin(11.0, "every learner trained its share of the token budget")
    assert ending.view() == {"phase": "finishing", "reason": "stopped by the operator", "since": 10.0, "summary": None}


def test_a_summary_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    assert read_summary(tmp_path) is None
    write_summary(tmp_path, {"reason": "done", "val_bpb": 3.1})
    assert read_summary(tmp_path) == {"reason": "done", "val_bpb": 3.1}
    assert not list(tmp_path.glob("*.tmp"))
    (tmp_path / "summary.json").write_text('{"reason": "cut sh')  # a torn file reads as "not finished", loudly
    assert read_summary(tmp_path) is None


# -- the real service -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_job_ends_when_its_budget_is_trained_and_the_syncer_leaves(tmp_path: Path, jobs: list[Job]) -> None:
    job = Job.create(tmp_path, small_job(learners=2, tokens=60_000))
    jobs.append(job)
    job.start_syncer("--linger", "3")
    learners = [job.start_learner(f"L{i}") for i in range(2)]
    status = job.wait_for(lambda s: s["job"]["phase"] == "finished", 240, "the job to finish")
    assert [proc.wait(timeout=60) for proc in learners] == [0, 0]
    assert all(job.summary(f"L{i}")["reason"] == FINISHED for i in range(2))
    assert job.local.process is not None and job.local.process.wait(timeout=30) == 0  # the syncer left by itself

    summary = status["job"]["summary"]
    assert summary == json.loads((job.job_dir / "state" / "summary.json").read_text())
    assert summary["reason"] == "every learner trained its share of the token budget"
    assert summary["learners_finished"] == ["L0", "L1"]
    tokens = summary["tokens"]
    trained = sum(job.summary(f"L{i}")["trained_tokens"] for i in range(2)) // 4  # fragment-tokens -> tokens
    assert tokens["pending"] == 0
    assert tokens["merged"] + tokens["late_merged"] <= tokens["received"] <= tokens["trained"] == trained
    assert trained == tokens["planned"] <= tokens["budget"] == 60_000
    assert tokens["merged"] + tokens["late_merged"] + tokens["dropped"] + tokens["rejected"] == tokens["received"]
    assert 0 < summary["val_bpb"] < 8.0 and summary["rounds"] == status["rounds"] > 0
    assert summary["bytes_up"] > 0 and summary["snapshot_bytes"] > 0
    # goodput: the seconds each learner's loop trained (its own summary's), as its heartbeats said them (every 0.5 s:
    # the last steps may go unsaid), over learners x the syncer's uptime
    trained_s = [job.summary(f"L{i}")["train_seconds"] for i in range(2)]
    said = [entry["train_s"] for entry in status["learners"]]
    assert all(own - 2.0 <= heard <= own + 0.01 for own, heard in zip(trained_s, said, strict=True)), (trained_s, said)
    assert summary["goodput"] == pytest.approx(sum(said) / (2 * summary["uptime_s"]), abs=1e-3)
    assert 0 < summary["goodput"] < 1.0
    assert [e["reason"] for e in events(status, "leave")] == [FINISHED, FINISHED]
    assert len(events(status, "finishing")) == 1 and len(events(status, "finished")) == 1
    assert {entry["state"] for entry in status["learners"]} == {"finished"}

    # a syncer started again on the finished job's disk is finished from the start and lets no one train
    job.start_syncer("--linger", "30")
    again = job.status()
    assert again["job"]["phase"] == "finished" and again["job"]["summary"] == summary
    client = job.client("L0")
    with pytest.raises(Refused) as refused:
        client.register("L0", 99, "region-L0")
    client.close()
    assert refused.value.status == 410 and refused.value.code == "job_over"


@pytest.mark.slow
def test_stop_ends_a_job_early_every_learner_pushes_its_last_drift_and_leaves(tmp_path: Path, jobs: list[Job]) -> None:
    job = Job.create(tmp_path, small_job(learners=2, tokens=50_000_000))
    jobs.append(job)
    job.start_syncer("--linger", "30")
    learners = [job.start_learner(f"L{i}") for i in range(2)]
    job.wait_for(lambda s: s["rounds"] >= 3 and len(s["live"]) == 2, 180, "both learners merging")
    admin = job.client()
    first, second = admin.stop_job("stopped by the operator"), admin.stop_job("again")
    admin.close()
    assert first["stopping"] and first["phase"] == "finishing"
    assert not second["stopping"] and second["reason"] == "stopped by the operator"  # asking twice changes nothing
    status = job.wait_for(lambda s: s["job"]["phase"] == "finished", 120, "the stopped job to finish")
    assert [proc.wait(timeout=60) for proc in learners] == [0, 0]
    for i in range(2):
        summary = job.summary(f"L{i}")
        assert summary["reason"] == STOPPED and summary["drained"] and summary["unsent_tokens"] == 0
    result = status["job"]["summary"]
    assert result["reason"] == "stopped by the operator" and result["learners_finished"] == []
    assert result["tokens"]["pending"] == 0 and result["tokens"]["received"] <= result["tokens"]["trained"]
    assert result["tokens"]["trained"] < result["tokens"]["planned"]  # stopped early: less than the budget
