"""How many uploads a learner keeps in flight: the fewest that keep its measured uplink busy.

Uploads that share a link each move at a fraction of it, so the update due first waits for the
others: with three in flight, the earliest is acknowledged after about three transfers' time instead
of one, and more of a backlog lands late. One at a time, though, leaves the link idle between an
upload's last byte and the next one's first: the syncer decoding and fsyncing, the answer coming
back, the uploader encoding the next update (one at a time reached 82-88% of a shaped link, three
93%: docs/benchmarks.md). With ``n`` in flight the link is busy ``min(1, n * T / (T + g))`` of
the time, ``T`` being one upload's transfer time with the link to itself and ``g`` that gap. The
cap is the smallest ``n`` that reaches ``target``, at most ``most``.

``T`` comes from the uploads that had the link to themselves: their bytes over their connection's
kernel busy time, summed (a short transfer may read 0 busy seconds, and summing keeps that
unbiased). ``g`` comes from every upload: its wall time from leaving the queue (encoding
included) to its answer, less its own connection's busy time, since sharing the link stretches
both alike. The median of the latest few keeps one stalled answer from moving the cap. Until an
upload has been timed alone the cap is 1, which times one; where the kernel times none (no
``TCP_INFO``), the cap is ``most`` once a few uploads went by untimed, as a fixed count would be.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

TARGET_BUSY = 0.95
"""The share of time the uplink should be busy: past it, another upload in flight buys little but delay."""
WINDOW = 8
"""Uploads remembered: enough that one odd one does not move the cap, few enough to follow a changing link."""


@dataclass(slots=True)
class InFlightCap:
    """The in-flight cap from the latest uploads' timings (pure: the caller feeds it and holds any lock)."""

    most: int
    target: float = TARGET_BUSY
    solo: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    """(bytes, busy seconds) of uploads that had the link to themselves."""
    gaps: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    """(bytes, seconds the link sat idle for it) of every timed upload."""
    untimed: int = 0
    """Acknowledged uploads the kernel said nothing about."""

    def __post_init__(self) -> None:
        if self.most < 1:
            raise ValueError(f"the most uploads in flight must be >= 1, got {self.most}")
        if not 0.0 < self.target <= 1.0:
            raise ValueError(f"the target share of busy time must be in (0, 1], got {self.target}")

    def observe(self, nbytes: int, busy_s: float, wall_s: float, alone: bool) -> None:
        """One acknowledged upload: ``busy_s`` from its connection's kernel counters, ``wall_s`` from queue to answer."""
        if nbytes <= 0 or not (math.isfinite(busy_s) and math.isfinite(wall_s)) or busy_s < 0 or wall_s < 0:
            return
        if alone:
            self.solo.append((nbytes, busy_s))
        self.gaps.append((nbytes, max(wall_s - busy_s, 0.0)))

    def observe_untimed(self) -> None:
        """An acknowledged upload the kernel said nothing about (no ``TCP_INFO`` here)."""
        self.untimed += 1

    def transfer_s(self) -> float | None:
        """A typical upload's transfer time with the link to itself; None before one was timed alone."""
        if not self.solo or not self.gaps:
            return None
        busy = sum(seconds for _, seconds in self.solo)
        if busy <= 0.0:
            return 0.0
        rate = sum(nbytes for nbytes, _ in self.solo) / busy
        return statistics.median(nbytes for nbytes, _ in self.gaps) / rate

    def gap_s(self) -> float:
        return statistics.median(gap for _, gap in self.gaps) if self.gaps else 0.0

    def cap(self) -> int:
        """The fewest uploads in flight that keep the link busy ``target`` of the time, within [1, most]."""
        transfer = self.transfer_s()
        if transfer is None:
            return self.most if self.untimed >= WINDOW // 2 else 1
        if transfer <= 0.0:
            return self.most  # transfers too short to time: the gaps are all there is to fill
        needed = math.ceil(self.target * (transfer + self.gap_s()) / transfer - 1e-9)
        return max(1, min(self.most, needed))


AUTO_MOST = 3
"""The most uploads a paced learner keeps in flight (three reached 93% of a shaped link)."""
MOST_IN_FLIGHT = 64
"""The most a learner may be told to keep in flight: each is a thread with its own connection."""


def parse_in_flight(text: str, option: str = "--parallel-uploads") -> int | None:
    """``auto`` (None: paced, up to ``AUTO_MOST``) or a fixed count; ``option`` names it in the error."""
    if text.strip().lower() == "auto":
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= MOST_IN_FLIGHT:
        raise ValueError(f"{option} takes 'auto' or a whole number in [1, {MOST_IN_FLIGHT}], got {text!r}")
    return count


def in_flight_text(count: int | None) -> str:
    """What ``parse_in_flight`` reads back as ``count``."""
    return "auto" if count is None else str(count)
