"""A data-parallel rank that goes silent is named with its phase and stack, and a run stuck in its rendezvous starts
again (``local/rank_watch.py``, ``local/baseline.py``)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from ddctl.local import baseline
from ddctl.local.baseline import _attempt, _Job, run_data_parallel
from ddctl.local.rank_watch import RankWatch, StalledRanks
from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget
from ddctl_agents.train.presets import get_preset

INNER = InnerConfig(preset="tiny", batch_size=4, warmup_steps=1, seed=3)
DATA = DataConfig(max_bytes=1 << 16, eval_windows=2)


def watch_of(phases: dict[int, tuple[str, float]], stall_s: float = 10.0) -> RankWatch:
    watch = RankWatch(stall_s, 0.0)
    for rank, (phase, at) in phases.items():
        watch.hear(rank, phase, at)
    return watch


def test_a_rank_waiting_on_its_peers_past_the_limit_is_stalled_and_said_where() -> None:
    watch = watch_of({0: ("joining", 0.0), 1: ("joining", 5.0)})
    assert watch.stalled(10.0, done=()) == [] and watch.stalled(10.5, done=()) == [0]
    assert watch.stalled(16.0, done=()) == [0, 1] and watch.stalled(16.0, done={1}) == [0]  # one that reported is done
    assert watch.describe([0], 16.0) == "rank 0 silent 16 s while joining" and watch.restartable([0, 1])
    watch.hear(1, "training", 16.0)  # a beat: heard again
    assert watch.stalled(20.0, done=()) == [0] and not watch.restartable([0, 1])  # one had trained: no free restart


def test_a_rank_at_its_own_work_or_waiting_for_a_starting_peer_is_not_stalled() -> None:
    assert watch_of({0: ("evaluating", 0.0), 1: ("starting", 0.0)}).stalled(1e6, done=()) == []
    waiting = watch_of({0: ("joining", 0.0), 1: ("starting", 0.0)})  # rank 1 still loads its data: 0 waits for it
    assert waiting.stalled(1e6, done=()) == []
    waiting.hear(1, "joining", 1e6)
    assert waiting.stalled(1e6, done=()) == [0]
    with pytest.raises(ValueError, match="unknown phase 'sleeping'; phases: starting, joining, training, evaluating"):
        waiting.hear(0, "sleeping", 0.0)


def test_a_rank_alone_in_its_rendezvous_is_named_with_its_phase_and_stack(tmp_path: Any) -> None:
    job = _Job(inner=INNER, data=DATA, budget=RunBudget(tokens=10_000, learners=2), threads=1, port=0,
               keep_params=False, stacks=str(tmp_path))  # fmt: skip
    began = time.monotonic()
    with pytest.raises(StalledRanks) as raised:
        _attempt(job, range(1), timeout_s=300, stall_s=3.0)  # a world of two, one rank spawned: it waits for the other
    assert time.monotonic() - began < 120  # not gloo's 600-s timeout
    message = str(raised.value)
    assert message.startswith("rank 0 silent ") and "while joining" in message and raised.value.restartable
    assert "rank 0's stack:" in message and "_join_group" in message  # where it waited, from the rank itself


def test_a_run_stuck_in_its_rendezvous_starts_again_and_one_stuck_in_training_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real, calls = _attempt, []
    budget = RunBudget(tokens=2 * 2 * INNER.batch_size * get_preset("tiny").seq_len, learners=2)

    def first_stuck(job: _Job, ranks: range, timeout_s: float, stall_s: float) -> dict[int, dict[str, Any]]:
        calls.append(job.stacks)
        if len(calls) == 1:
            raise StalledRanks("rank 1 silent 300 s while joining", restartable=True)
        return real(job, ranks, timeout_s, stall_s)

    monkeypatch.setattr(baseline, "_attempt", first_stuck)
    result = run_data_parallel(INNER, DATA, budget, timeout_s=300)
    assert result["restarts"] == 1 and len(calls) == 2 and calls[0] != calls[1]  # a fresh folder (and store) each time
    assert result["steps"] == 2 and len(result["rank_params_sha256"]) == 2

    def stuck_training(job: _Job, ranks: range, timeout_s: float, stall_s: float) -> dict[int, dict[str, Any]]:
        calls.append(job.stacks)
        raise StalledRanks("rank 0 silent 300 s while training", restartable=False)

    monkeypatch.setattr(baseline, "_attempt", stuck_training)
    calls.clear()
    with pytest.raises(StalledRanks, match="while training"):
        run_data_parallel(INNER, DATA, budget, timeout_s=300)
    assert len(calls) == 1  # steps were lost: it says so instead of starting again


def test_a_rank_sends_its_report_before_it_leaves_its_group(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    events: list[str] = []
    monkeypatch.setattr(baseline, "_leave", lambda *, grouped: events.append(f"left grouped={grouped}"))
    job = _Job(inner=INNER, data=DATA, budget=RunBudget(tokens=2 * INNER.batch_size * get_preset("tiny").seq_len,
               learners=1), threads=1, port=0, keep_params=False, stacks=str(tmp_path))  # fmt: skip
    baseline._train_rank(0, job, lambda phase: events.append(phase), lambda report: events.append(f"sent {report['steps']}"))
    assert events == ["training", "evaluating", "sent 2", "left grouped=False"]  # a hung teardown cannot hold the report


def test_a_rank_that_lingers_after_its_report_is_killed_and_named() -> None:
    ctx = torch.multiprocessing.get_context("spawn")
    procs = {0: ctx.Process(target=time.sleep, args=(0.0,)), 1: ctx.Process(target=time.sleep, args=(120.0,))}
    for proc in procs.values():
        proc.start()
    began = time.monotonic()
    assert baseline._stop(procs, grace_s=3.0) == [1]
    assert time.monotonic() - began < 60 and not any(proc.is_alive() for proc in procs.values())


class Replies:
    """A results queue answering from a list, then empty."""

    def __init__(self, replies: list[tuple[str, int, Any]]) -> None:
        self.replies = replies

    def get(self, timeout: float) -> tuple[str, int, Any]:
        if not self.replies:
            raise baseline.queue.Empty
        return self.replies.pop(0)


class Running:
    exitcode = None


def test_a_failure_after_a_ranks_report_keeps_the_report_and_one_before_it_fails_the_run(tmp_path: Any) -> None:
    job = _Job(inner=INNER, data=DATA, budget=RunBudget(tokens=10_000, learners=2), threads=1, port=0,
               keep_params=False, stacks=str(tmp_path))  # fmt: skip
    procs = {0: Running(), 1: Running()}
    after = Replies([("ok", 1, {"steps": 3}), ("error", 1, "Traceback: teardown"), ("ok", 0, {"steps": 3})])
    assert baseline._collect(after, procs, job, timeout_s=60, stall_s=60) == {0: {"steps": 3}, 1: {"steps": 3}}
    before = Replies([("ok", 0, {"steps": 3}), ("error", 1, "Traceback: step 2")])
    with pytest.raises(baseline.WorkerError, match="rank 1 failed:\nTraceback: step 2"):
        baseline._collect(before, procs, job, timeout_s=60, stall_s=60)
