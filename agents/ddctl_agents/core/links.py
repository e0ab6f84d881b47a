"""Per-learner link and pace estimates the syncer keeps from real observations.

RTT is an exponentially weighted moving average; step time is the median of
recent steps, robust to one slow step. Pure: every observation comes in as an
argument.

Rates are measured where the bytes really move: by the sending side's kernel
(``tcpinfo.py``), as bytes acknowledged over the time the connection was busy.
The syncer reads its own sockets for every learner's downlink; a learner reads
its upload connections and reports its uplink in its heartbeats. Only transfers
that can say something about bandwidth count (``MIN_TRANSFER_BYTES``, not held
back by the reader), pooled until the kernel's coarse busy clock has run long
enough (``MIN_SAMPLE_S``). Such a sample is a lower bound of the link's
bandwidth: a sender the CPU kept waiting, a loss and its recovery, congestion
control's own caution can only lengthen a transfer, and only a shaper's burst
(kept small, ``linkshape.py``) or the busy clock's coarse tick can shorten it.
So, as BBR estimates a bottleneck
(Cardwell et al., 2016), the rate is the best of the recent samples: the second
best of the last ``KERNEL_SAMPLES``, so that one sample alone (a measuring error,
or a learner's lie) cannot make it. Timing reads and writes in the application
(``TransferMeter``) is the fallback where the kernel cannot say, averaged
(EWMA), and gives way to the first kernel-timed sample.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

MAX_RATE = 1e13
"""Bytes per second (80 Tbit/s): a faster sample is a measuring error, not a link."""
MAX_RTT_S = 600.0
MIN_TRANSFER_BYTES = 64 * 1024
"""A smaller transfer is bound by latency, slow start and a shaper's burst, not by bandwidth: it is ignored."""
MIN_SAMPLE_S = 0.1
"""Kernel-timed transfers pool into one sample until they span this long: busy time ticks in jiffies (4 ms at
HZ=250), unbiased but coarse, and 25 ticks keep one sample within 4%. No longer: a transfer that went well
must not be pooled with one that did not (one 0.6 MB upload took 156 ms, the next on the same link 364 ms)."""
MAX_POOLED = 16
"""...or until this many have pooled over at least ``MIN_POOLED_S``, on a link so fast that 0.1 s of transfers
would take minutes to gather."""
MIN_POOLED_S = 0.05
KERNEL_SAMPLES = 8
"""How many recent kernel-timed samples the rate is the second best of."""
MAX_WINDOW_S = 1.0
"""A connection busy this long without a pause (a saturated link) is read anyway, idle or not."""
MAX_STALLED = 0.1
"""A transfer the receiver's window held back for more than this share of its busy time measured the reader (a
syncer whose event loop fell behind, a learner reading on loopback), not the link: it is ignored."""


@dataclass(slots=True)
class LinkEstimate:
    """One direction's throughput (bytes/s: see the module docstring) and an EWMA of round-trip latency."""

    alpha: float = 0.3
    bytes_per_s: float | None = None
    rtt_s: float | None = None
    transfers: int = 0
    total_bytes: int = 0
    """Bytes in the samples the rate was read from."""
    kernel: bool = False
    """A sample timed by the sender's kernel has arrived; samples the application timed are ignored from then on."""
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=KERNEL_SAMPLES))
    """The latest kernel-timed rates."""

    def observe(self, nbytes: int, seconds: float, rtt_s: float | None = None, *, kernel: bool = False) -> None:
        """Record one transfer of ``nbytes`` that took ``seconds`` end to end.

        ``kernel``: bytes acknowledged over busy time, as the sending side's kernel counted them.
        The first such sample replaces whatever the application's timing said. One under
        ``MIN_TRANSFER_BYTES`` cannot tell a bandwidth and is ignored (it may come from a
        learner's heartbeat: nothing obliges it to be sensible).
        A rate or RTT outside what any link can do (``MAX_RATE``, ``MAX_RTT_S``) is ignored, so
        no sample can push an estimate to infinity."""
        bandwidth_bound = not kernel or nbytes >= MIN_TRANSFER_BYTES
        usable = bandwidth_bound and (kernel or not self.kernel)
        if usable and seconds > 0 and nbytes > 0 and (rate := nbytes / seconds) <= MAX_RATE:
            if kernel:
                if not self.kernel:
                    self.recent.clear()
                self.recent.append(rate)
                ranked = sorted(self.recent)
                self.bytes_per_s = ranked[-2] if len(ranked) >= 3 else ranked[-1]
            elif self.bytes_per_s is None:
                self.bytes_per_s = rate
            else:
                self.bytes_per_s = self.alpha * rate + (1 - self.alpha) * self.bytes_per_s
            self.kernel = self.kernel or kernel
            self.total_bytes += nbytes
        if rtt_s is not None and 0 <= rtt_s <= MAX_RTT_S:
            self.rtt_s = rtt_s if self.rtt_s is None else self.alpha * rtt_s + (1 - self.alpha) * self.rtt_s
        self.transfers += 1

    def send_time(self, nbytes: int) -> float | None:
        """Seconds the link is busy putting ``nbytes`` on the wire (latency not included), or None before any sample."""
        return None if self.bytes_per_s is None else nbytes / self.bytes_per_s

    def transfer_time(self, nbytes: int) -> float | None:
        """Predicted seconds from sending ``nbytes`` until they have all arrived (one-way latency included)."""
        send = self.send_time(nbytes)
        return None if send is None else (self.rtt_s or 0.0) / 2 + send


@dataclass(slots=True)
class Pace:
    """A learner's recent step times and its last reported position."""

    window: int = 16
    step_times: deque[float] = field(default_factory=deque)
    last_step: int = 0
    reported_at: float = 0.0
    due: tuple[int, ...] = ()
    """Each fragment's next due step as the learner last reported it (empty: unknown)."""

    def observe(self, now: float, step: int, step_time: float, due: tuple[int, ...] = ()) -> None:
        self.last_step, self.reported_at = step, now
        if due:
            self.due = due
        if step_time > 0:
            self.step_times.append(step_time)
            while len(self.step_times) > self.window:
                self.step_times.popleft()

    @property
    def step_time(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None


@dataclass(slots=True)
class LearnerLinks:
    """Everything measured about one learner: uplink, downlink and pace."""

    up: LinkEstimate = field(default_factory=LinkEstimate)
    down: LinkEstimate = field(default_factory=LinkEstimate)
    pace: Pace = field(default_factory=Pace)
    inflight: dict[int, tuple[float, int, int]] = field(default_factory=dict)
    """fragment -> (when last seen, bytes received, bytes expected) of an upload in progress."""

    def predict_arrival(self, now: float, due_step: int, upload_bytes: int, fragment: int | None = None) -> float | None:
        """When this learner's update due at ``due_step`` should land, from pace and uplink.

        The clock starts at the learner's last heartbeat, which reached us one uplink latency
        after that step ended; the update, sent when ``due_step`` ends, takes that same latency
        on top of its send time. So the latency is already in the start and is not added again
        (it was once, and the grace window gave up on arrivals that would have made it).
        A send due in the past is on its way: it lands when it would have, or any moment now.
        An upload of ``fragment`` known to be in progress lands when its remaining bytes do.
        """
        if fragment is not None and fragment in self.inflight and self.up.bytes_per_s:
            seen, received, expected = self.inflight[fragment]
            return max(seen, now) + max(expected - received, 0) / self.up.bytes_per_s
        step_time, upload = self.pace.step_time, self.up.send_time(upload_bytes)
        if step_time is None or upload is None:
            return None
        start = self.pace.reported_at + max(due_step - self.pace.last_step, 0) * step_time
        return max(start + upload, now)


@dataclass(slots=True)
class TransferMeter:
    """Throughput of a link that may carry several uploads at once: bytes over busy time.

    Timing each upload alone would halve the rate when two share the link;
    instead the meter counts every byte while any upload is active and yields
    a (bytes, seconds) sample when the link goes idle or every ``window_s``.
    The clock of a busy period starts at its first chunk, and that chunk is not
    counted: its bytes crossed the link before anyone could look at a clock
    (counting them read a shaped 80 Mbit/s link as 140). A busy period that was
    one chunk only has nothing else to time, so it falls back to that chunk over
    the time since its request began (which reads high, but is not nothing).
    Samples shorter than ``min_s`` are too short to tell and are dropped.
    """

    window_s: float = 0.5
    min_s: float = 0.002
    active: int = 0
    busy_since: float = 0.0
    nbytes: int = 0
    clock_started: bool = False
    opened: float = 0.0
    first_chunk: int = 0

    def start(self, now: float) -> None:
        if self.active == 0:
            self.busy_since, self.nbytes, self.clock_started, self.opened = now, 0, False, now
        self.active += 1

    def add(self, nbytes: int, now: float) -> None:
        if not self.clock_started:
            self.busy_since, self.clock_started, self.first_chunk = now, True, nbytes
            return
        self.nbytes += nbytes

    def finish(self, now: float) -> tuple[int, float] | None:
        """One upload ended (done or broken); returns a sample when one is due."""
        self.active = max(self.active - 1, 0)
        if self.active and now - self.busy_since < self.window_s:
            return None
        sample = (self.nbytes, now - self.busy_since)
        if self.nbytes == 0 and self.first_chunk:
            sample = (self.first_chunk, now - self.opened)
        self.busy_since, self.nbytes, self.first_chunk = now, 0, 0
        return sample if sample[0] > 0 and sample[1] >= self.min_s else None


@dataclass(frozen=True, slots=True, kw_only=True)
class SendCounters:
    """A sending connection's cumulative kernel counters at one moment (``tcpinfo.sending`` reads them)."""

    connection: int
    """Identifies the connection: the counters of two connections never subtract."""
    acked: int
    """Bytes the peer has acknowledged, ever."""
    busy_s: float
    """Seconds the connection had data in flight or queued, ever."""
    stalled_s: float
    """Of those, seconds the peer's receive window held the sender back."""
    idle: bool
    """Nothing unsent and nothing unacknowledged at this moment."""
    quiet_s: float = 0.0
    """When idle, seconds since the peer acknowledged the last byte: how long ago the connection's last transfer
    ended (0 while busy)."""

    def at_open(self) -> SendCounters:
        """This connection's counters when it opened: a connection made during a transfer is read from its start."""
        return SendCounters(connection=self.connection, acked=0, busy_s=0.0, stalled_s=0.0, idle=True)


def sent_between(
    before: SendCounters | None, after: SendCounters | None, min_bytes: int = MIN_TRANSFER_BYTES
) -> tuple[int, float] | None:
    """(bytes, busy seconds) a connection delivered between two readings; None if that says nothing about the link.

    Nothing is said by readings of different connections (or a missing one), by fewer than
    ``min_bytes`` (for the link's rate; the pacer, which wants the idle gap too, takes any), or by
    a transfer the receiver held back for more than ``MAX_STALLED`` of its time. Busy time may read
    0 for a short transfer: the jiffy clock ticked in none of it, and keeping such zeros is what
    keeps the pooled sum unbiased."""
    if before is None or after is None or before.connection != after.connection:
        return None
    nbytes, seconds = after.acked - before.acked, after.busy_s - before.busy_s
    if nbytes < max(min_bytes, 1) or seconds < 0 or after.stalled_s - before.stalled_s > MAX_STALLED * seconds:
        return None
    return nbytes, seconds


@dataclass(slots=True)
class RatePool:
    """Adds up transfers until they span ``min_s`` of busy time (or ``max_count`` of them ``MIN_POOLED_S``),
    then yields them as one (bytes, seconds) sample."""

    min_s: float = MIN_SAMPLE_S
    max_count: int = MAX_POOLED
    nbytes: int = 0
    seconds: float = 0.0
    count: int = 0

    def add(self, nbytes: int, seconds: float) -> tuple[int, float] | None:
        self.nbytes, self.seconds, self.count = self.nbytes + nbytes, self.seconds + seconds, self.count + 1
        if self.seconds < self.min_s and not (self.count >= self.max_count and self.seconds >= MIN_POOLED_S):
            return None
        sample = (self.nbytes, self.seconds)
        self.nbytes, self.seconds, self.count = 0, 0.0, 0
        return sample


@dataclass(slots=True)
class DeliveryMeter:
    """The rate one connection delivers, from its kernel counters read whenever it suits the caller.

    A window runs from one idle reading (every byte written so far acknowledged) to the
    next: the bytes acknowledged and the busy time in between are then exactly what crossed
    the link and how long it took, whenever the readings were taken. A connection that is
    never idle (a saturated link) is read every ``max_window_s`` of busy time; the bytes in
    flight at either end are then at most a queue's worth, small against a second.
    """

    pool: RatePool = field(default_factory=RatePool)
    max_window_s: float = MAX_WINDOW_S
    base: SendCounters | None = None
    closed: Window | None = None
    """The window the latest reading closed, unpooled and with when it ended, for a meter that lays windows on a
    clock (``sitemeter``): read late, a window ended when its last byte was acknowledged, not when it was read."""

    def read(self, counters: SendCounters | None) -> tuple[int, float] | None:
        """A reading of the connection's counters; a (bytes, seconds) sample when one is due."""
        base, self.closed = self.base, None
        if counters is None or base is None or base.connection != counters.connection:
            self.base = counters
            return None
        if not (base.idle and counters.idle) and counters.busy_s - base.busy_s < self.max_window_s:
            if counters.idle:
                self.base = counters  # a window that began mid-transfer is not read short: start afresh
            return None
        self.base = counters
        window = sent_between(base, counters)
        if window is None:
            return None
        self.closed = Window(*window, ended_ago=counters.quiet_s)
        return self.pool.add(*window)


class Window(NamedTuple):
    """What one connection moved between two readings (``sent_between``), and when that ended."""

    nbytes: int
    seconds: float
    ended_ago: float
    """Seconds before the reading (0: the connection was still busy when read)."""


@dataclass(slots=True)
class SoloTransfers:
    """Samples from the transfers that had a link to themselves (a learner's uploaders share one link).

    Two uploads at once each get part of the link, so neither times the link. Charging
    each its share of the time would need to know when the other was really sending: one
    that is stuck (connecting, or cut off by a partition) shares nothing, and counting it
    read a 10 Mbit/s link as 29. So a transfer is a sample only if no other was under way
    at any moment of it, by the caller's clock. A link kept busy by overlapping uploads
    keeps its latest estimate (and the syncer's own meter serves until there is one).
    Keys name transfers under way.
    """

    pool: RatePool = field(default_factory=RatePool)
    active: dict[int, float] = field(default_factory=dict)
    last_end: float = -math.inf
    """When the latest transfer ended."""
    last_alone: bool = False
    """Whether the latest transfer to end had the link to itself."""

    def begin(self, key: int, now: float) -> None:
        self.active[key] = now

    def end(self, key: int, window: tuple[int, float] | None, now: float) -> tuple[int, float] | None:
        """Transfer ``key`` is over, with what its kernel says it took (``sent_between``); a sample when one is due."""
        start = self.active.pop(key, now)
        self.last_alone = alone = not self.active and self.last_end <= start
        self.last_end = max(self.last_end, now)
        return self.pool.add(*window) if window is not None and alone else None


@dataclass(slots=True)
class QuorumClock:
    """Seconds during which at least ``quorum`` learners were live: the global model could advance."""

    quorum: int
    since: float
    live: int = 0
    total: float = 0.0

    def update(self, now: float, live: int) -> None:
        self.total = self.seconds(now)
        self.since, self.live = now, live

    def seconds(self, now: float) -> float:
        return self.total + (max(now - self.since, 0.0) if self.live >= self.quorum else 0.0)
