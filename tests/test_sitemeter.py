"""The site meter: the link a site's connections shared, read from what each one moved and when."""

from __future__ import annotations

import math
import time

import pytest

from ddctl_agents.core.sitemeter import BIN_S, MAX_PENDING, SETTLE_S, SiteMeter

MBIT = 1e6 / 8


def test_five_connections_sharing_a_link_read_the_link_not_their_share() -> None:
    meter = SiteMeter()
    for second in range(1, 9):  # each connection moves a fifth of 60 Mbit/s, read once a second
        for _ in range(5):
            meter.add(100.0 + second, 1.0, round(12 * MBIT))
    meter.read(109.0 + SETTLE_S)
    assert meter.bytes_per_s == pytest.approx(60 * MBIT, rel=1e-6)
    alone = SiteMeter()
    alone.add(101.0, 1.0, round(12 * MBIT))
    alone.read(101.0 + 2 * SETTLE_S)
    assert alone.bytes_per_s == pytest.approx(12 * MBIT, rel=1e-6)  # one connection's share, as it was


def test_transfers_at_different_moments_are_not_added_up() -> None:
    meter = SiteMeter()
    meter.add(10.5, 0.5, round(5 * MBIT))  # 10 Mbit/s over [10, 10.5)
    meter.add(11.0, 0.5, round(5 * MBIT))  # 10 Mbit/s over [10.5, 11): the same bin, one after the other
    meter.add(12.0, 0.25, round(2.5 * MBIT))  # 10 Mbit/s over [11.75, 12)
    meter.read(20.0)
    assert meter.bytes_per_s == pytest.approx(10 * MBIT, rel=1e-6)


def test_half_overlapping_transfers_count_their_union_once() -> None:
    meter = SiteMeter()
    meter.add(10.6, 0.6, 6_000_000)  # [10.0, 10.6): 10 MB/s
    meter.add(11.0, 0.6, 6_000_000)  # [10.4, 11.0): 10 MB/s; both at once in [10.4, 10.6)
    meter.read(20.0)
    assert meter.bytes_per_s == pytest.approx(12_000_000 / 1.0)  # 12 MB over the one second some link was busy


def test_a_transfer_too_short_for_the_busy_clock_counts_its_bytes_in_its_bin() -> None:
    meter = SiteMeter()
    meter.add(10.5, 0.0, 100_000)  # no jiffy ticked in it: bytes, no time of their own
    meter.add(10.9, 0.1, 1_000_000)  # [10.8, 10.9)
    meter.add(12.0, 0.0, 100_000)  # at the next bin's left edge: that bin's, once
    meter.add(12.5, 0.1, 1_000_000)
    meter.add(13.0, 0.0, 100_000)  # on the edge of the first bin not yet read: kept for it
    meter.read(13.0 + SETTLE_S)
    assert meter.estimate.total_bytes == 2_200_000 and meter.bytes_per_s == pytest.approx(1_100_000 / 0.1)
    meter.add(11.5, 0.0, 100_000)  # in a bin already read: lost, not moved
    meter.add(13.5, 0.1, 1_000_000)
    meter.add(15.0, 0.0, 100_000)  # alone in its bin: nothing to divide by
    meter.read(16.0 + SETTLE_S)
    assert meter.estimate.total_bytes == 3_300_000 and meter.pending == []


def test_a_report_across_bins_is_spread_over_them_and_read_once_settled() -> None:
    meter = SiteMeter()
    meter.add(12.5, 2.0, 20_000_000)  # [10.5, 12.5): 10 MB/s, over three bins
    meter.read(12.5 + SETTLE_S - 0.01)  # bin [12, 13) has not settled: two bins read, the third waits
    assert meter.bytes_per_s == pytest.approx(10_000_000) and len(meter.pending) == 1
    meter.read(13.0 + SETTLE_S)
    assert meter.pending == [] and meter.estimate.total_bytes == pytest.approx(20_000_000, abs=2)


def test_nothing_is_read_before_its_bin_settles() -> None:
    meter = SiteMeter()
    meter.add(10.9, 0.9, 1_000_000)
    meter.read(10.9)
    assert meter.bytes_per_s is None
    meter.read(11.0 + SETTLE_S)
    assert meter.bytes_per_s == pytest.approx(1_000_000 / 0.9)


@pytest.mark.parametrize(
    ("now", "seconds", "nbytes"),
    [(math.nan, 1.0, 1_000_000), (10.0, math.inf, 1_000_000), (10.0, -1.0, 1_000_000), (10.0, 0.0, 1_000_000),
     (10.0, 1.0, 0), (10.0, 1.0, -5), (10.0, 1.0, 1 << 60), (math.inf, 1.0, 1_000_000), (10.0, 7200.0, 1_000_000)],
)  # fmt: skip
def test_nonsense_reports_are_ignored(now: float, seconds: float, nbytes: int) -> None:
    meter = SiteMeter()
    meter.add(now, seconds, nbytes)
    meter.read(100.0)
    assert meter.pending == [] and meter.bytes_per_s is None


def test_a_flood_of_reports_keeps_only_the_latest() -> None:
    meter = SiteMeter()
    for i in range(MAX_PENDING + 100):
        meter.add(10.0 + i * 1e-6, 1e-6, 100)
    assert len(meter.pending) == MAX_PENDING and meter.pending[0][1] == pytest.approx(10.0 + 100 * 1e-6)


def test_a_late_report_for_a_bin_already_read_keeps_only_its_unread_part() -> None:
    meter = SiteMeter()
    meter.add(10.5, 0.5, 1_000_000)
    meter.read(10.0 + BIN_S + SETTLE_S)  # bin [10, 11) is read
    meter.add(11.5, 1.0, 2_000_000)  # [10.5, 11.5): half of it falls in the read bin
    assert meter.pending == [(11.0, 11.5, 1_000_000)]


def test_a_meter_left_unread_for_long_reads_its_reports_once_and_fast() -> None:
    meter = SiteMeter()
    for i in range(MAX_PENDING):  # an hour of reports, one every 0.9 s, and nobody reading the page
        meter.add(10.0 + 0.9 * i, 0.5, 500_000)
    meter.add(90_000.5, 0.5, 500_000)  # and one much later, across a long idle gap
    started = time.thread_time()  # this thread's CPU time: a machine busy elsewhere does not count
    meter.read(100_000.0)
    assert time.thread_time() - started < 0.5
    read = meter.estimate.total_bytes
    assert meter.pending == [] and read == pytest.approx(500_000 * MAX_PENDING, abs=4096)  # the oldest went at the cap
    assert meter.bytes_per_s == pytest.approx(1e6)
