"""Per-learner link and pace estimates the syncer keeps from real observations.

Throughput and RTT are exponentially weighted moving averages of measured
transfers; step time is the median of recent steps, robust to one slow step.
Pure: every observation comes in as an argument.

Rates are measured where the bytes really move: by the sending side's kernel
(``tcpinfo.py``), as bytes acknowledged over the time the connection was busy.
The syncer reads its own sockets for every learner's downlink; a learner reads
its upload connections and reports its uplink in its heartbeats. Only transfers
that can say something about bandwidth count (``MIN_TRANSFER_BYTES``), pooled
until the kernel's coarse busy clock has run long enough (``MIN_SAMPLE_S``).
Timing reads and writes in the application (``TransferMeter``) is the fallback
where the kernel cannot say, and gives way to the first kernel-timed sample.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

MAX_RATE = 1e13
"""Bytes per second (80 Tbit/s): a faster sample is a measuring error, not a link."""
MAX_RTT_S = 600.0
MIN_TRANSFER_BYTES = 64 * 1024
"""A smaller transfer is bound by latency, slow start and a shaper's burst, not by bandwidth: it is ignored."""
MIN_SAMPLE_S = 0.1
"""Kernel-timed transfers pool into one sample until they span this long: busy time ticks in jiffies (4 ms at
HZ=250), unbiased but coarse, and 25 ticks keep one sample within a few percent."""
MAX_POOLED = 16
"""...or until this many have pooled, on a link so fast that 0.1 s of transfers would take minutes to gather."""
MAX_WINDOW_S = 1.0
"""A connection busy this long without a pause (a saturated link) is read anyway, idle or not."""


@dataclass(slots=True)
class LinkEstimate:
    """EWMA of one direction's throughput (bytes/s) and of round-trip latency."""

    alpha: float = 0.3
    bytes_per_s: float | None = None
    rtt_s: float | None = None
    transfers: int = 0
    total_bytes: int = 0
    """Bytes in the samples the rate was read from."""
    kernel: bool = False
    """A sample timed by the sender's kernel has arrived; samples the application timed are ignored from then on."""

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
            fresh = self.bytes_per_s is None or (kernel and not self.kernel)
            self.bytes_per_s = rate if fresh else self.alpha * rate + (1 - self.alpha) * (self.bytes_per_s or rate)
            self.kernel = self.kernel or kernel
            self.total_bytes += nbytes
        if rtt_s is not None and 0 <= rtt_s <= MAX_RTT_S:
            self.rtt_s = rtt_s if self.rtt_s is None else self.alpha * rtt_s + (1 - self.alpha) * self.rtt_s
        self.transfers += 1

    def transfer_time(self, nbytes: int) -> float | None:
        """Predicted seconds to move ``nbytes`` (latency included), or None before any sample."""
        if self.bytes_per_s is None:
            return None
        return (self.rtt_s or 0.0) / 2 + nbytes / self.bytes_per_s


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

        An upload of ``fragment`` already in progress lands when its remaining bytes do.
        """
        if fragment is not None and fragment in self.inflight and self.up.bytes_per_s:
            seen, received, expected = self.inflight[fragment]
            return max(seen, now) + max(expected - received, 0) / self.up.bytes_per_s
        step_time, upload = self.pace.step_time, self.up.transfer_time(upload_bytes)
        if step_time is None or upload is None:
            return None
        start = self.pace.reported_at + max(due_step - self.pace.last_step, 0) * step_time
        return max(start, now) + upload


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
    """Seconds the connection had data in flight or queued, ever (a slow reader's stalls included: they are
    part of what a transfer to that reader takes)."""
    idle: bool
    """Nothing unsent and nothing unacknowledged at this moment."""


def sent_between(before: SendCounters | None, after: SendCounters | None) -> tuple[int, float] | None:
    """(bytes, busy seconds) a connection delivered between two readings; None if that says nothing about the link.

    Nothing is said by readings of different connections (or a missing one), or by fewer than
    ``MIN_TRANSFER_BYTES``. Busy time may read 0 for a short transfer: the jiffy clock ticked
    in none of it, and keeping such zeros is what keeps the pooled sum unbiased."""
    if before is None or after is None or before.connection != after.connection:
        return None
    nbytes, seconds = after.acked - before.acked, after.busy_s - before.busy_s
    if nbytes < MIN_TRANSFER_BYTES or seconds < 0:
        return None
    return nbytes, seconds


@dataclass(slots=True)
class RatePool:
    """Adds up transfers until they span ``min_s`` of busy time (or ``max_count`` of them some time at all),
    then yields them as one (bytes, seconds) sample."""

    min_s: float = MIN_SAMPLE_S
    max_count: int = MAX_POOLED
    nbytes: int = 0
    seconds: float = 0.0
    count: int = 0

    def add(self, nbytes: int, seconds: float) -> tuple[int, float] | None:
        self.nbytes, self.seconds, self.count = self.nbytes + nbytes, self.seconds + seconds, self.count + 1
        if self.seconds < self.min_s and not (self.count >= self.max_count and self.seconds > 0):
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

    def read(self, counters: SendCounters | None) -> tuple[int, float] | None:
        """A reading of the connection's counters; a (bytes, seconds) sample when one is due."""
        base = self.base
        if counters is None or base is None or base.connection != counters.connection:
            self.base = counters
            return None
        if not (base.idle and counters.idle) and counters.busy_s - base.busy_s < self.max_window_s:
            if counters.idle:
                self.base = counters  # a window that began mid-transfer is not read short: start afresh
            return None
        self.base = counters
        window = sent_between(base, counters)
        return None if window is None else self.pool.add(*window)


@dataclass(frozen=True, slots=True)
class Transfer:
    """One transfer on one connection: handed to it at ``start``, then ``seconds`` busy delivering ``nbytes``."""

    start: float
    nbytes: int
    seconds: float

    @property
    def end(self) -> float:
        return self.start + self.seconds


@dataclass(slots=True)
class SharedLink:
    """Bytes over busy time of one link that several connections send on at once (a learner's uploaders).

    Each connection's kernel times its own transfers (``sent_between``), but transfers that
    overlap shared the link: two uploads at half speed each are one link at full speed. So a
    transfer is charged only its share of the link's time: over its interval, each moment
    that n transfers overlapped counts 1/n. A transfer still under way counts as running from
    its start until now (it is, as far as anyone knows). A link that is never free (three
    uploads always in flight) is measured like any other. Keys name transfers under way.
    """

    pool: RatePool = field(default_factory=RatePool)
    active: dict[int, float] = field(default_factory=dict)
    done: list[Transfer] = field(default_factory=list)
    """Finished transfers that one still under way may have overlapped."""

    def begin(self, key: int, now: float) -> None:
        self.active[key] = now

    def end(self, key: int, transfer: Transfer | None, now: float) -> tuple[int, float] | None:
        """Transfer ``key`` is over (None: it said nothing about the link); a sample when one is due."""
        self.active.pop(key, None)
        sample = None
        if transfer is not None:
            others = [(t.start, t.end) for t in self.done] + [(start, now) for start in self.active.values()]
            sample = self.pool.add(transfer.nbytes, _share(transfer.start, transfer.end, others))
            self.done.append(transfer)
        oldest = min(self.active.values(), default=math.inf)
        self.done = [t for t in self.done if t.end > oldest]
        return sample


def _share(start: float, end: float, others: list[tuple[float, float]]) -> float:
    """Seconds of [start, end] that belong to it: each moment shared with n - 1 of ``others`` counts 1/n."""
    points = sorted({start, end, *(p for interval in others for p in interval if start < p < end)})
    share = 0.0
    for a, b in zip(points, points[1:], strict=False):
        middle = (a + b) / 2
        share += (b - a) / (1 + sum(1 for s, e in others if s <= middle < e))
    return share


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
