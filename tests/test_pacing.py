"""The in-flight cap: the fewest uploads that keep a measured uplink busy (core/pacing, agent/slots)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import threading
import time

import pytest

from ddctl_agents.agent.slots import UploadSlots
from ddctl_agents.core.links import SoloTransfers
from ddctl_agents.core.pacing import AUTO_MOST, InFlightCap, in_flight_text, parse_in_flight

MB = 1_000_000


def fed(most: int, transfer_s: float, gap_s: float, uploads: int = 8, alone: bool = True) -> InFlightCap:
    cap = InFlightCap(most)
    for _ in range(uploads):
        cap.observe(MB, transfer_s, transfer_s + gap_s, alone)
    return cap


def test_the_cap_is_one_until_an_upload_was_timed_alone() -> None:
    cap = InFlightCap(3)
    assert cap.cap() == 1 and cap.transfer_s() is None
    cap.observe(MB, 3.0, 3.3, alone=False)  # shared the link: its busy time is not one transfer's
    assert cap.cap() == 1 and cap.transfer_s() is None
    cap.observe(MB, 1.0, 1.3, alone=True)
    assert cap.transfer_s() == pytest.approx(1.0) and cap.cap() == 2


@pytest.mark.parametrize(
    ("transfer_s", "gap_s", "expected"),
    [
        (1.0, 0.0, 1),  # the link never idles between uploads: one at a time fills it
        (1.0, 0.05, 1),  # 1 / 1.05 = 0.952 busy: past the target
        (1.0, 0.06, 2),  # 1 / 1.06 = 0.943: one more
        (1.0, 0.13, 2),  # the 88% one uploader measured on a shaped link
        (1.0, 1.0, 2),  # two fill it exactly
        (1.0, 1.2, 3),
        (1.0, 50.0, 3),  # a long gap wants many, but never past the most
    ],
)
def test_the_cap_is_the_fewest_uploads_that_keep_the_link_busy(transfer_s: float, gap_s: float, expected: int) -> None:
    cap = fed(3, transfer_s, gap_s)
    assert cap.cap() == expected
    n = cap.cap()  # the model the cap rests on: n in flight keep the link busy min(1, n T / (T + g))
    assert min(1.0, n * transfer_s / (transfer_s + gap_s)) >= 0.95 or n == 3
    assert n == 1 or (n - 1) * transfer_s / (transfer_s + gap_s) < 0.95  # one fewer would not do


def test_the_gap_is_measured_from_shared_uploads_too() -> None:
    cap = fed(3, 1.0, 0.0)  # timed alone: T = 1 s
    assert cap.cap() == 1
    for _ in range(8):  # three sharing the link: each busy 3 s, with 1.2 s of answer after it
        cap.observe(MB, 3.0, 4.2, alone=False)
    assert cap.transfer_s() == pytest.approx(1.0) and cap.gap_s() == pytest.approx(1.2)
    assert cap.cap() == 3


def test_one_stalled_answer_does_not_move_the_cap() -> None:
    cap = fed(3, 1.0, 0.02)
    cap.observe(MB, 1.0, 30.0, alone=True)  # a syncer that paused once (a snapshot, a GC)
    assert cap.cap() == 1
    for _ in range(4):
        cap.observe(MB, 1.0, 30.0, alone=True)
    assert cap.cap() == 3  # but a gap that persists over most of the window does


def test_the_transfer_time_follows_the_frame_size() -> None:
    cap = InFlightCap(3)
    cap.observe(4 * MB, 4.0, 4.0, alone=True)  # 1 MB/s
    for _ in range(8):
        cap.observe(MB // 2, 0.5, 1.0, alone=False)  # half-size frames, 0.5 s of gap each
    assert cap.transfer_s() == pytest.approx(0.5) and cap.cap() == 2


def test_transfers_too_short_to_time_take_the_most() -> None:
    cap = InFlightCap(4)
    cap.observe(10_000, 0.0, 0.05, alone=True)  # busy time reads 0 below a jiffy: only the gap shows
    assert cap.transfer_s() == 0.0 and cap.cap() == 4


@pytest.mark.parametrize(
    ("nbytes", "busy", "wall"), [(0, 1.0, 2.0), (-5, 1.0, 2.0), (MB, math.nan, 2.0), (MB, 1.0, math.inf), (MB, -1.0, 2.0)]
)
def test_a_reading_that_says_nothing_is_ignored(nbytes: int, busy: float, wall: float) -> None:
    cap = fed(3, 1.0, 0.0)
    cap.observe(nbytes, busy, wall, alone=True)
    assert len(cap.gaps) == 8 and cap.cap() == 1 and cap.transfer_s() == pytest.approx(1.0)


def test_a_cap_needs_a_sensible_most_and_target() -> None:
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        InFlightCap(0)
    with pytest.raises(ValueError, match=r"in \(0, 1\], got 1.5"):
        InFlightCap(3, target=1.5)


@pytest.mark.parametrize(("text", "expected"), [("auto", None), (" AUTO ", None), ("1", 1), ("4", 4)])
def test_the_option_reads_auto_or_a_count(text: str, expected: int | None) -> None:
    assert parse_in_flight(text) == expected
    assert parse_in_flight(in_flight_text(expected)) == expected  # what a bench passes on to a learner reads back


@pytest.mark.parametrize("text", ["0", "-2", "two", "", "1.5", "65"])
def test_a_bad_option_says_what_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"takes 'auto' or a whole number in [1, 64], got {text!r}")):
        parse_in_flight(text)


def test_the_learner_refuses_a_bad_count_with_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ddctl_agents.agent", "learner", "--syncer", "http://127.0.0.1:9", "--name", "L0",
         "--parallel-uploads", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--parallel-uploads takes 'auto' or a whole number in [1, 64], got '0'" in done.stderr


def test_solo_transfers_say_whether_the_last_one_had_the_link_to_itself() -> None:
    solo = SoloTransfers()
    solo.begin(1, 0.0)
    solo.end(1, (MB, 1.0), 1.0)
    assert solo.last_alone
    solo.begin(1, 2.0)
    solo.begin(2, 2.5)
    solo.end(1, (MB, 1.0), 3.0)
    assert not solo.last_alone  # 2 was under way
    solo.end(2, (MB, 1.0), 3.5)
    assert not solo.last_alone  # 1 was under way when 2 began


def test_slots_hold_uploads_to_the_cap_and_open_as_the_pacer_allows() -> None:
    slots, stopping = UploadSlots(None), threading.Event()
    assert slots.most == AUTO_MOST and slots.cap() == 1
    assert slots.take(stopping)
    second: list[bool] = []
    waiter = threading.Thread(target=lambda: second.append(slots.take(stopping)))
    waiter.start()
    time.sleep(0.3)
    assert not second  # held at the cap of one
    for _ in range(8):
        slots.timed((MB, 1.0), 2.0, alone=True)  # as long idle as busy: two in flight
    waiter.join(timeout=30.0)
    assert second == [True] and slots.cap() == 2
    slots.free()
    slots.free()


def test_fixed_slots_ignore_timings_and_a_stop_releases_a_waiter() -> None:
    slots, stopping = UploadSlots(2), threading.Event()
    slots.timed((MB, 1.0), 1.0, alone=True)
    assert slots.pacer is None and slots.cap() == 2
    assert slots.take(stopping) and slots.take(stopping)
    third: list[bool] = []
    waiter = threading.Thread(target=lambda: third.append(slots.take(stopping)))
    waiter.start()
    stopping.set()
    waiter.join(timeout=30.0)
    assert third == [False]
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        UploadSlots(0)


def test_where_the_kernel_times_nothing_the_cap_becomes_the_most() -> None:
    slots = UploadSlots(None)
    for _ in range(3):
        slots.timed(None, 1.0, alone=True)
    assert slots.cap() == 1
    slots.timed(None, 1.0, alone=True)
    assert slots.cap() == AUTO_MOST  # no TCP_INFO here: as a fixed three would be
    slots.timed((MB, 1.0), 1.02, alone=True)
    assert slots.cap() == 1  # a timed upload says what the link needs


def test_small_uploads_are_timed_for_the_pacer_but_not_for_the_rate() -> None:
    from ddctl_agents.core.links import MIN_TRANSFER_BYTES, SendCounters, sent_between

    def reading(acked: int, busy: float) -> SendCounters:
        return SendCounters(connection=1, acked=acked, busy_s=busy, stalled_s=0.0, idle=True)

    small = (reading(0, 0.0), reading(16_000, 0.012))  # a 16 KB update at 10 Mbit/s
    assert MIN_TRANSFER_BYTES > 16_000 and sent_between(*small) is None
    assert sent_between(*small, min_bytes=1) == (16_000, 0.012)
