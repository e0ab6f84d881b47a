"""Per-learner link and pace estimates the syncer keeps from real observations.

Throughput and RTT are exponentially weighted moving averages of measured
transfers; step time is the median of recent steps, robust to one slow step.
Pure: every observation comes in as an argument.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

MAX_RATE = 1e13
"""Bytes per second (80 Tbit/s): a faster sample is a measuring error, not a link."""
MAX_RTT_S = 600.0


@dataclass(slots=True)
class LinkEstimate:
    """EWMA of one direction's throughput (bytes/s) and of round-trip latency."""

    alpha: float = 0.3
    bytes_per_s: float | None = None
    rtt_s: float | None = None
    transfers: int = 0
    total_bytes: int = 0

    def observe(self, nbytes: int, seconds: float, rtt_s: float | None = None) -> None:
        """Record one transfer of ``nbytes`` that took ``seconds`` end to end.

        A rate or RTT outside what any link can do (``MAX_RATE``, ``MAX_RTT_S``) is ignored, so
        no sample can push an estimate to infinity."""
        if seconds > 0 and nbytes > 0 and (rate := nbytes / seconds) <= MAX_RATE:
            self.bytes_per_s = rate if self.bytes_per_s is None else self.alpha * rate + (1 - self.alpha) * self.bytes_per_s
        if rtt_s is not None and 0 <= rtt_s <= MAX_RTT_S:
            self.rtt_s = rtt_s if self.rtt_s is None else self.alpha * rtt_s + (1 - self.alpha) * self.rtt_s
        self.transfers += 1
        self.total_bytes += max(nbytes, 0)

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
