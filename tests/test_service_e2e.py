"""The real distributed system on loopback: a syncer process, learner processes, kill -9.

Every process speaks HTTP/2 over TLS with the job's own CA; nothing is mocked.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddctl_agents.waiting import wait_until
from tests.service_harness import ENV, Job, small_job

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def job_factory(tmp_path: Path) -> Iterator[list[Job]]:
    jobs: list[Job] = []
    yield jobs
    for job in jobs:
        job.stop_all()


def learner_view(status: dict, name: str) -> dict:
    return next(entry for entry in status["learners"] if entry["id"] == name)


def test_three_learners_train_and_status_shows_their_links(tmp_path: Path, job_factory: list[Job]) -> None:
    # long enough for ~60 fragment records per learner: the syncer's kernel needs 0.1 s of busy time (or 16
    # transfers) to time a downlink, and on a loaded loopback some records are read too slowly to count (at
    # 300,000 tokens, ~40 records, one CI run timed none of L2's 21 MB: the reader held them back)
    job = Job.create(tmp_path, small_job(learners=3, tokens=450_000))
    job_factory.append(job)
    job.start_syncer("--eval-every", "2")
    for i in range(3):
        job.start_learner(f"L{i}")

    def measured(entry: dict) -> bool:
        return bool(entry["up_mbps"] and entry["down_mbps"] and entry["rtt_ms"] is not None)

    running = job.wait_for(
        # figures stay with a learner that has finished its budget (the job ends now), so live-ness is not required
        lambda s: len(s["learners"]) == 3 and all(measured(e) for e in s["learners"]),
        120,
        "three learners with link figures",
    )
    assert {r["name"] for r in running["regions"]} == {"region-L0", "region-L1", "region-L2"}
    job.wait_learners()
    status = job.wait_for(
        lambda s: s["ledger"]["pending"] == 0 and len(s["val_bpb"]) >= 2 and s["val_bpb"][-1][1] == s["rounds"],
        30,
        "the last rounds to close and a final evaluation",
    )
    curve = [bpb for _, _, bpb in status["val_bpb"]]
    assert curve[-1] < curve[0] - 1.0, curve  # from ~7.8 (uniform bytes) down by more than a bit per byte
    summaries = [job.summary(f"L{i}") for i in range(3)]
    assert all(s["drained"] and s["reason"] == "finished" for s in summaries)
    assert all(s["restarts"] == 0 for s in summaries)  # recovered from its state: the same history, no learner restarts
    ledger = status["ledger"]
    assert ledger["balanced"] and ledger["pending"] == 0
    assert ledger["received"] == sum(sum(s["acked_tokens"].values()) for s in summaries)
    assert sum(s["sent_tokens"] for s in summaries) == ledger["received"]


def test_a_learner_killed_mid_upload_never_stalls_the_others(tmp_path: Path, job_factory: list[Job]) -> None:
    job = Job.create(tmp_path, small_job(learners=3, tokens=400_000))
    job_factory.append(job)
    job.start_syncer("--heartbeat-timeout", "3")
    job.start_learner("L0")
    job.start_learner("L1")
    job.wait_for(lambda s: s["rounds"] >= 2, 120, "the first rounds")
    marker = tmp_path / "half"
    ca = str(job.job_dir / "tls" / "ca.pem")
    doomed = subprocess.Popen(
        [sys.executable, "-m", "tests.partial_upload", job.url, job.token("L2"), ca, str(marker)],
        cwd=ROOT,
        env={**ENV, "PYTHONPATH": f"{ROOT}:{ROOT / 'agents'}"},
    )

    def half_sent() -> bool:
        assert doomed.poll() is None, "the partial uploader died"
        return marker.exists()

    wait_until(half_sent, timeout_s=60, every_s=0.05, what="the partial uploader to get going")
    job.kill(doomed)  # SIGKILL with half an update on the wire
    rounds_at_kill = job.status()["rounds"]
    status = job.wait_for(  # K=1: rounds keep closing; L2 is declared gone after its heartbeat timeout (3 s)
        lambda s: s["rounds"] >= rounds_at_kill + 3 and "L2" not in s["live"], 60, "rounds to close without L2"
    )
    assert learner_view(status, "L2")["updates"] == {}  # the partial upload was never merged

    l1_step = learner_view(status, "L1")["step"]
    job.kill(job.learners["L1"])  # a real learner this time, at whatever it was doing
    time.sleep(1)
    job.start_learner("L1")  # the replacement rejoins on its own
    job.wait_learners()
    summary = job.summary("L1")
    assert summary["reason"] == "finished"
    assert summary["start_step"] >= l1_step - 8  # at most H steps stale (H = 8 in this job)
    final = job.status()
    assert final["ledger"]["balanced"]
    assert learner_view(final, "L1")["incarnation"] == summary["incarnation"]


def test_a_killed_syncer_restarts_from_its_snapshot_and_loses_nothing(tmp_path: Path, job_factory: list[Job]) -> None:
    job = Job.create(tmp_path, small_job(learners=3, tokens=300_000))
    job_factory.append(job)
    job.start_syncer("--snapshot-every", "1")
    for i in range(3):
        job.start_learner(f"L{i}")
    before = job.wait_for(lambda s: s["rounds"] >= 6 and s["snapshots"]["taken"] >= 1, 120, "rounds and a snapshot")
    job.local.kill()  # kill -9: no shutdown snapshot, no goodbye
    time.sleep(1.5)
    job.start_syncer("--snapshot-every", "1")
    job.wait_learners()  # the learners carried on by themselves
    status = job.status()
    assert status["recovered"]["snapshot"] is True
    assert status["rounds"] > before["rounds"]
    summaries = [job.summary(f"L{i}") for i in range(3)]
    assert all(s["drained"] and s["reason"] == "finished" for s in summaries)
    assert all(s["restarts"] == 0 for s in summaries)  # recovered from its state: the same history, no learner restarts
    ledger = status["ledger"]
    acked = sum(sum(s["acked_tokens"].values()) for s in summaries)
    sent = sum(s["sent_tokens"] for s in summaries)
    in_flight = sent - acked  # zero: every learner drained before leaving
    assert in_flight == 0
    assert ledger["merged"] + ledger["late_merged"] + ledger["dropped"] + ledger["pending"] + in_flight == sent
    assert ledger["received"] == acked  # nothing acknowledged was lost, nothing counted twice


def test_sigterm_pushes_pending_drift_and_leaves_gracefully(tmp_path: Path, job_factory: list[Job]) -> None:
    job = Job.create(tmp_path, small_job(learners=2, tokens=400_000))
    job_factory.append(job)
    job.start_syncer()
    job.start_learner("L0")
    leaver = job.start_learner("L1")
    job.wait_for(
        lambda s: s["rounds"] >= 3 and len(s["live"]) == 2 and learner_view(s, "L1")["rtt_ms"] is not None,
        120,
        "both learners merging, L1 with a measured RTT",
    )
    leaver.send_signal(signal.SIGTERM)
    assert leaver.wait(timeout=60) == 0
    summary = job.summary("L1")
    assert summary["reason"] == "sigterm" and summary["drained"] and summary["unsent_tokens"] == 0
    assert sum(summary["acked_tokens"].values()) == summary["sent_tokens"]  # every pending gradient landed
    status = job.status()
    assert learner_view(status, "L1")["state"] == "left" and status["live"] == ["L0"]
    assert any(e["event"] == "leave" and e["learner"] == "L1" and e["reason"] == "sigterm" for e in status["events"])
    admin = job.client()
    metrics = admin.metrics()
    admin.close()
    assert 'ddctl_link_rtt_seconds{learner="L1",region="region-L1"}' in metrics
    assert "ddctl_learners_live 1" in metrics


def test_the_dead_man_switch_ends_a_learner_whose_syncer_is_gone(tmp_path: Path, job_factory: list[Job]) -> None:
    job = Job.create(tmp_path, small_job(learners=1, tokens=2_000_000))
    job_factory.append(job)
    job.start_syncer()
    learner = job.start_learner("L0", "--syncer-timeout", "10")
    job.wait_for(lambda s: s["rounds"] >= 2, 120, "training")
    job.local.kill()
    assert learner.wait(timeout=60) == 6  # the dead-man switch ends as "unreachable", as ddctl's exit code 6
    summary = job.summary("L0")
    assert summary["reason"] == "syncer_gone" and summary["step"] < summary["start_step"] + 10_000


def test_a_restarted_syncer_still_files_each_learners_links_under_its_region(tmp_path: Path, job_factory: list[Job]) -> None:
    """The region a learner registered with survives a ``kill -9`` of the syncer: the learner does not register again
    (the log says it is live), and its later links must still count for its region (the re-planner reads them)."""
    job = Job.create(tmp_path, small_job(learners=1, tokens=300_000))
    job_factory.append(job)
    job.start_syncer()
    learner = job.client("L0")
    learner.register("L0", 1, "europe-west4")
    beat = {"learner": "L0", "step": 3, "step_time": 0.5, "tokens": 3072, "tokens_per_s": 2048.0}
    learner.heartbeat({**beat, "up_bytes": 1_000_000, "up_seconds": 0.2})
    learner.close()
    job.local.kill()
    job.start_syncer()
    learner = job.client("L0")
    try:
        learner.heartbeat({**beat, "step": 4, "up_bytes": 2_000_000, "up_seconds": 0.2, "region": "europe-west4"})
        learner.heartbeat({**beat, "step": 5, "region": "us-east1"})  # registration's region stands: no moving
        learner.heartbeat({**beat, "step": 6, "up_bytes": 10_000, "up_seconds": 0.01})  # too small to tell a bandwidth
    finally:
        learner.close()
    status = job.status()
    assert learner_view(status, "L0")["region"] == "europe-west4"
    (row,) = status["regions"]
    assert row["name"] == "europe-west4" and row["up_mbps"] == pytest.approx(80.0)  # 2 MB in 0.2 s, after the restart
    # The bytes the rate was read from: the 2 MB sample since the restart, not the 10 kB one it left out.
    assert learner_view(status, "L0")["up_sampled_bytes"] == row["up_sampled_bytes"] == 2_000_000
