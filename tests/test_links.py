from __future__ import annotations

import pytest

from ddctl_agents.core.links import (
    KERNEL_SAMPLES,
    MIN_TRANSFER_BYTES,
    DeliveryMeter,
    LearnerLinks,
    LinkEstimate,
    Pace,
    RatePool,
    SendCounters,
    SoloTransfers,
    TransferMeter,
    Window,
    sent_between,
)


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


# -- kernel-timed samples -----------------------------------------------------------------------


def counters(
    acked: int, busy_s: float, idle: bool = True, connection: int = 1, stalled_s: float = 0.0, quiet_s: float = 0.0
) -> SendCounters:
    return SendCounters(connection=connection, acked=acked, busy_s=busy_s, stalled_s=stalled_s, idle=idle, quiet_s=quiet_s)


def test_a_kernel_sample_replaces_application_timing_which_is_ignored_from_then_on() -> None:
    link = LinkEstimate(alpha=0.5)
    link.observe(80_000_000, 1.0)  # a late reader's guess: 640 Mbit/s
    link.observe(6_250_000, 1.0, kernel=True)  # the sender's kernel: 50 Mbit/s
    assert link.bytes_per_s == 6_250_000 and link.kernel
    link.observe(80_000_000, 1.0)  # application timing no longer moves it
    assert link.bytes_per_s == 6_250_000
    assert link.total_bytes == 80_000_000 + 6_250_000  # the bytes the rate was read from


def test_the_rate_is_the_second_best_recent_kernel_sample() -> None:
    link = LinkEstimate()
    link.observe(6_000_000, 1.0, kernel=True)
    link.observe(4_500_000, 1.0, kernel=True)  # a starved sender or a loss recovery: only ever slower
    assert link.bytes_per_s == 6_000_000
    link.observe(10**12, 1.0, kernel=True)  # one absurd sample (a learner's lie) does not make the figure
    assert link.bytes_per_s == 6_000_000
    for _ in range(KERNEL_SAMPLES):  # the link got slower: the old samples age out
        link.observe(3_000_000, 1.0, kernel=True)
    assert link.bytes_per_s == 3_000_000


def test_a_kernel_sample_too_small_to_tell_a_bandwidth_is_ignored_but_its_rtt_counts() -> None:
    link = LinkEstimate()
    link.observe(MIN_TRANSFER_BYTES - 1, 0.001, rtt_s=0.02, kernel=True)  # a heartbeat's few KB: latency-bound
    link.observe(1 << 40, 0.0, kernel=True)  # no time at all: no rate
    link.observe(1 << 62, 1e-300, kernel=True)  # faster than any link: a measuring error (or a lie)
    assert link.bytes_per_s is None and not link.kernel and link.rtt_s == 0.02


def test_sent_between_needs_two_readings_of_one_connection_and_enough_bytes() -> None:
    assert sent_between(counters(0, 0.0), counters(600_000, 0.096)) == (600_000, 0.096)
    assert sent_between(None, counters(600_000, 0.096)) is None
    assert sent_between(counters(0, 0.0), counters(600_000, 0.096, connection=2)) is None  # reconnected
    assert sent_between(counters(0, 0.0), counters(MIN_TRANSFER_BYTES - 1, 0.004)) is None  # latency-bound
    assert sent_between(counters(0, 0.0), counters(70_000, 0.0)) == (70_000, 0.0)  # the jiffy clock did not tick: kept
    # the syncer's event loop fell behind and its window closed: that timed the reader, not the link
    assert sent_between(counters(0, 0.0), counters(600_000, 0.756, stalled_s=0.208)) is None
    assert sent_between(counters(0, 0.0), counters(600_000, 0.5, stalled_s=0.04)) == (600_000, 0.5)  # a moment's stall
    opened = counters(600_000, 0.5, connection=7).at_open()  # a connection made for the transfer: read whole
    assert sent_between(opened, counters(600_000, 0.5, connection=7)) == (600_000, 0.5)


def test_the_pool_gathers_transfers_until_the_busy_clock_has_run_long_enough() -> None:
    pool = RatePool(min_s=0.1, max_count=16)
    assert pool.add(300_000, 0.048) is None
    assert pool.add(300_000, 0.052) == (600_000, pytest.approx(0.1))
    for n in range(16):  # a fast link: 75 KB transfers that mostly fit between two ticks of the busy clock
        assert pool.add(75_000, 0.004 if n % 3 == 0 else 0.0) is None  # 16 of them, but 6 ticks are too few
    assert pool.add(75_000, 0.028) == (1_275_000, pytest.approx(0.052))  # 13 ticks: enough
    for _ in range(20):
        assert pool.add(75_000, 0.0) is None  # no time at all yet: still nothing to divide by


def test_a_delivery_meter_reads_windows_between_idle_moments_whenever_it_is_read() -> None:
    meter = DeliveryMeter(pool=RatePool(min_s=0.05))
    assert meter.read(counters(1_000, 0.010)) is None  # the first reading is a base
    assert meter.read(counters(200_000, 0.040, idle=False)) is None  # mid-transfer: the window stays open
    assert meter.read(counters(601_000, 0.106)) == (600_000, pytest.approx(0.096))  # 50 Mbit/s, read late or not
    assert meter.read(counters(601_050, 0.107)) is None  # a keep-alive: too small to say anything
    assert meter.read(None) is None  # the kernel could not say: start again
    assert meter.read(counters(0, 0.0, connection=2)) is None  # a new connection: a new base
    assert meter.read(counters(700_000, 0.112, connection=2)) == (700_000, pytest.approx(0.112))


def test_a_delivery_meter_closes_each_window_alone_and_says_when_it_ended() -> None:
    meter = DeliveryMeter(pool=RatePool(min_s=0.5))  # a pool that needs several windows before it yields a sample
    assert meter.read(counters(0, 0.0)) is None and meter.closed is None
    assert meter.read(counters(600_000, 0.1, quiet_s=3.25)) is None  # pooled, not yet a sample...
    assert meter.closed == Window(600_000, pytest.approx(0.1), ended_ago=3.25)  # ...but a window, ended 3.25 s ago
    assert meter.read(counters(600_010, 0.1, quiet_s=0.5)) is None and meter.closed is None  # a keep-alive: no window
    assert meter.read(counters(900_000, 0.4, idle=False)) is None and meter.closed is None  # mid-transfer: still open
    assert meter.read(counters(2_000_000, 1.2, idle=False)) is not None  # saturated: read busy, so it ends now
    assert meter.closed == Window(1_399_990, pytest.approx(1.1), ended_ago=0.0)


def test_a_delivery_meter_reads_a_link_that_is_never_idle_every_window() -> None:
    meter = DeliveryMeter(pool=RatePool(min_s=0.1), max_window_s=1.0)
    assert meter.read(counters(0, 0.0, idle=False)) is None
    assert meter.read(counters(500_000, 0.4, idle=False)) is None
    assert meter.read(counters(1_250_000, 1.0, idle=False)) == (1_250_000, 1.0)  # 10 Mbit/s, saturated
    assert meter.read(counters(1_400_000, 1.1)) is None  # began mid-transfer and short: not read, started afresh
    assert meter.read(counters(2_650_000, 2.1)) == (1_250_000, pytest.approx(1.0))


def test_only_an_upload_that_had_the_link_to_itself_times_it() -> None:
    uploads = SoloTransfers(pool=RatePool(min_s=0.1))
    uploads.begin(1, 0.0)
    assert uploads.end(1, (600_000, 0.24), now=0.4) == (600_000, 0.24)  # alone: 20 Mbit/s
    uploads.begin(1, 1.0)
    uploads.begin(2, 1.1)  # two at once: each had part of the link
    assert uploads.end(1, (600_000, 0.45), now=1.6) is None
    assert uploads.end(2, (600_000, 0.40), now=1.7) is None  # the other ran during it too
    uploads.begin(3, 10.0)  # stuck: the syncer is cut off, it sends nothing for a minute
    uploads.begin(1, 70.0)
    assert uploads.end(1, (600_000, 0.08), now=70.3) is None  # it would read 60 Mbit/s "sharing" with the stuck one
    assert uploads.end(3, None, now=71.0) is None  # the stuck one failed: nothing to say
    uploads.begin(2, 72.0)
    assert uploads.end(2, (600_000, 0.25), now=72.4) == (600_000, 0.25)  # alone again
    assert uploads.active == {}
