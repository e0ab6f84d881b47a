"""``--synthetic-step``: a learner that waits instead of training, and is otherwise the real one (``bench wan``'s)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ddctl.local.service import LocalSyncer, tiny_job
from ddctl_agents.core.admission import check_update
from ddctl_agents.core.messages import FragmentVersion
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.optim import inner_lr
from ddctl_agents.train.synthetic import DRIFT_OF_LR, SyntheticTrainer
from tests.service_harness import ENV


@pytest.fixture(scope="module")
def assembly() -> Assembly:
    return Assembly.build(tiny_job(learners=2, tokens=60_000))


def test_a_synthetic_step_takes_its_time_and_moves_each_parameter_by_a_fraction_of_the_lr(assembly: Assembly) -> None:
    learner = assembly.new_learner(1, synthetic_step=0.05)
    trainer = learner.trainer
    assert isinstance(trainer, SyntheticTrainer)
    before = {k: v.detach().clone() for k, v in trainer.params.items()}
    started = time.perf_counter()
    loss = learner.train_step()
    took = time.perf_counter() - started
    assert 0.05 <= took < 5.0  # it waits out its step; the upper bound only says it does not hang (a busy CI stalls)
    lr = inner_lr(0, learner.total_steps, assembly.config.inner)
    for name, param in trainer.params.items():
        moved = (param.detach() - before[name]).abs().max().item()
        assert 0 < moved <= DRIFT_OF_LR * lr + 1e-8, name  # float32 rounding of the add
    assert float(loss) == 0.0 and learner.step == 1
    assert learner.ledger.trained == learner.tokens_per_step * assembly.fragmentation.count


def test_two_synthetic_learners_drift_apart_and_a_real_one_is_unchanged(assembly: Assembly) -> None:
    a, b = assembly.new_learner(0, synthetic_step=0.01), assembly.new_learner(1, synthetic_step=0.01)
    a.train_step(), b.train_step()
    name = next(iter(a.params))
    assert not torch.equal(a.params[name], b.params[name])
    assert not isinstance(assembly.new_learner(0).trainer, SyntheticTrainer)


def test_its_updates_pass_the_syncers_admission_check(assembly: Assembly) -> None:
    learner = assembly.new_learner(0, synthetic_step=0.001)
    for p in range(assembly.fragmentation.count):
        learner.adopt(_version(assembly, p))
    for _ in range(assembly.config.sync.inner_steps):
        learner.train_step()
    limits = assembly.update_limits()
    for p in range(assembly.fragmentation.count):
        update = learner.make_update(p)
        expected = {s.name: assembly.initial[s.name] for s in assembly.fragmentation.fragments[p]}
        assert check_update(update, expected, limits) is None
        assert max(t.abs().max().item() for t in update.tensors.values()) > 0


def _version(assembly: Assembly, p: int) -> FragmentVersion:
    names = [s.name for s in assembly.fragmentation.fragments[p]]
    return FragmentVersion(fragment=p, version=0, tensors={n: assembly.initial[n].clone() for n in names})


@pytest.mark.parametrize("seconds", ["-1", "nan", "inf", "4000", "1e-400x"])
def test_a_bad_synthetic_step_is_refused_with_what_is_allowed(seconds: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddctl_agents.agent",
            "--syncer",
            "https://127.0.0.1:9",
            "--name",
            "L0",
            "--token",
            "t",
            "--synthetic-step",
            seconds,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--synthetic-step" in done.stderr
    assert seconds == "1e-400x" or "must be 0 (train) or in (0, 3600] seconds" in done.stderr


def test_a_synthetic_learner_runs_a_job_through_the_real_syncer(tmp_path: Path) -> None:
    job = tiny_job(learners=1, tokens=40_000, inner_steps=4)
    with LocalSyncer(tmp_path, job, run="synthetic") as syncer:
        syncer.start()
        summary = tmp_path / "L0.json"
        argv = [sys.executable, "-m", "ddctl_agents.agent", "--syncer", syncer.url, "--name", "L0", "--token",
                syncer.token("L0"), "--ca", str(syncer.ca), "--summary", str(summary), "--synthetic-step", "0.02"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        client = syncer.client()
        try:
            status = client.status()
        finally:
            client.close()
    out = json.loads(summary.read_text())
    assert out["synthetic_step"] == 0.02 and out["loss"] is None
    assert 1 <= out["uploads_in_flight"] <= 3  # paced by default: the cap its uploads' timings gave, at most three
    steps = out["step"] - out["start_step"]
    assert steps > 0 and out["train_seconds"] >= 0.02 * steps
    assert out["trained_tokens"] == steps * 8 * 128 * 4  # batch 8 of 128 tokens, 4 fragments
    assert status["ledger"]["balanced"]
    assert status["ledger"]["merged"] + status["ledger"]["late_merged"] > 0
    assert math.isclose(sum(out["acked_tokens"].values()), status["ledger"]["received"], rel_tol=0, abs_tol=0)


def test_round_trips_run_from_a_fragments_send_to_its_next_adoption() -> None:
    from ddctl_agents.agent.roundtrip import RoundTrips

    trips = RoundTrips()
    adoptions: list[tuple[int, int, int]] = [(0, 0, 0), (1, 0, 0)]  # bootstraps: nothing was waiting
    trips.observe(0.0, [False, False], adoptions)
    trips.observe(1.0, [True, False], adoptions)  # fragment 0 sent
    trips.observe(1.5, [True, True], adoptions)  # fragment 1 sent; 0 still waits from 1.0
    adoptions.append((0, 1, 5))
    trips.observe(1.75, [False, True], adoptions)
    adoptions.append((1, 1, 9))
    trips.observe(3.5, [False, False], adoptions)
    assert trips.seconds == [0.75, 2.0]
    assert trips.summary() == {"count": 2, "p50_s": 1.375, "p95_s": 2.0}
    assert RoundTrips().summary() == {"count": 0, "p50_s": None, "p95_s": None}


def test_a_learner_given_a_start_file_registers_and_waits_for_it_before_its_first_step(tmp_path: Path) -> None:
    """``--start-when``: how ``bench wan`` starts its learners together (their imports alone spread them apart)."""
    job = tiny_job(learners=1, tokens=40_000, inner_steps=4)
    start, summary, wait_s = tmp_path / "start", tmp_path / "L0.json", 6.0
    with LocalSyncer(tmp_path / "syncer", job, run="gated") as syncer:
        syncer.start()
        argv = [sys.executable, "-m", "ddctl_agents.agent", "--syncer", syncer.url, "--name", "L0", "--token",
                syncer.token("L0"), "--ca", str(syncer.ca), "--summary", str(summary), "--synthetic-step", "0.02",
                "--start-when", str(start)]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
        client = syncer.client()
        try:
            deadline = time.monotonic() + 120
            while not client.status()["learners"] and time.monotonic() < deadline:  # registered
                time.sleep(0.1)
            assert client.status()["learners"], "the learner never registered"
            time.sleep(wait_s)
            assert proc.poll() is None and [r["step"] for r in client.status()["learners"]] == [0]  # waiting, not stepping
            assert (tmp_path / "start.L0.ready").exists()  # it says it waits (bench wan starts its learners once all do)
            start.touch()
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
        finally:
            client.close()
            if proc.poll() is None:
                proc.kill()
    out = json.loads(summary.read_text())
    assert out["step"] - out["start_step"] > 0
    assert out["train_seconds"] < wait_s  # the wait is not training time: 39 steps of 0.02 s


def test_a_start_file_over_several_machines_is_refused() -> None:
    argv = [sys.executable, "-m", "ddctl_agents.agent", "--syncer", "https://127.0.0.1:9", "--name", "L0", "--token", "t",
            "--nodes", "2", "--rendezvous", "127.0.0.1:29500", "--start-when", "/tmp/never"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=60)
    assert done.returncode == 2
    assert "--start-when names a file on one machine; give it with --nodes 1 only" in done.stderr
