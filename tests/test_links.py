from __future__ import annotations

import pytest

from ddctl_agents.core.links import LearnerLinks, LinkEstimate, Pace, TransferMeter


def test_ewma_moves_toward_new_throughput() -> None:
    link = LinkEstimate(alpha=0.5)
    assert link.transfer_time(100) is None
    link.observe(1000, 1.0, rtt_s=0.1)
    link.observe(3000, 1.0, rtt_s=0.3)
    assert link.bytes_per_s == pytest.approx(2000.0)
    assert link.rtt_s == pytest.approx(0.2)
    assert link.transfer_time(2000) == pytest.approx(0.1 + 1.0)
    assert (link.transfers, link.total_bytes) == (2, 4000)


def test_step_time_is_a_median_robust_to_one_slow_step() -> None:
    pace = Pace(window=5)
    for i, t in enumerate([1.0, 1.0, 9.0, 1.0, 1.0, 1.0]):
        pace.observe(float(i), i, t)
    assert pace.step_time == 1.0 and len(pace.step_times) == 5


def test_arrival_forecast_uses_pace_and_uplink() -> None:
    links = LearnerLinks()
    assert links.predict_arrival(0.0, 5, 100) is None
    links.pace.observe(10.0, step=3, step_time=2.0)
    links.up.observe(1000, 1.0)
    # two more steps (4 s after the report) then 0.5 s to upload 500 bytes
    assert links.predict_arrival(11.0, 5, 500) == pytest.approx(14.5)


def test_transfer_meter_measures_concurrent_uploads_as_one_link() -> None:
    meter = TransferMeter(window_s=10.0)
    meter.start(0.0)
    meter.start(0.0)  # two uploads share the link
    meter.add(64, 0.0)  # the first chunk starts the clock; it arrived before anyone looked, so it is not counted
    meter.add(500, 0.5)
    meter.add(500, 1.0)
    assert meter.finish(1.0) is None  # the link is still busy with the other one
    assert meter.finish(1.0) == (1000, 1.0)  # 1000 bytes in 1 s, not 500 per upload
    meter.start(5.0)
    meter.add(64, 5.2)  # a client slow to send: the clock starts with its first bytes, not the request
    meter.add(100, 5.5)
    assert meter.finish(5.7) == (100, pytest.approx(0.5))  # idle time between uploads is not counted


def test_transfer_meter_samples_a_busy_link_and_drops_too_short_samples() -> None:
    meter = TransferMeter(window_s=0.5)
    meter.start(0.0)
    meter.start(0.0)
    meter.add(1, 0.0)
    meter.add(300, 0.3)
    assert meter.finish(0.6) == (300, 0.6)  # a sample every window while busy
    meter.add(200, 0.9)
    assert meter.finish(1.0) == (200, pytest.approx(0.4))
    meter.start(2.0)
    meter.add(1, 2.0)
    meter.add(2000, 2.001)
    assert meter.finish(2.001) is None  # 1 ms: too short to tell
    meter.start(3.0)
    meter.add(5000, 3.5)  # one chunk: nothing after it to time
    assert meter.finish(3.5) == (5000, 0.5)  # so it is timed from its request's start instead
    meter.start(4.0)
    meter.add(5000, 4.001)
    assert meter.finish(4.001) is None  # 1 ms: too short to tell


def test_the_quorum_clock_counts_only_time_with_enough_learners_live() -> None:
    from ddctl_agents.core.links import QuorumClock

    clock = QuorumClock(quorum=2, since=0.0)
    clock.update(10.0, 1)  # one learner from t=10: not enough
    clock.update(15.0, 2)  # quorum from t=15
    clock.update(40.0, 1)  # lost at t=40
    assert clock.seconds(50.0) == 25.0
    clock.update(60.0, 3)
    assert clock.seconds(70.0) == 35.0
