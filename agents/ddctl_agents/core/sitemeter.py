"""A site's own link, from every transfer that crossed it: the fan-out a per-learner rate cannot see (pure).

A shard sends each new version to every learner at once, so each connection gets
a share of the site's link and times a share: on a 60 Mbit/s site five learners'
downlinks read 9-38 Mbit/s each, and every estimate built on them reads the site
that much slower than it is. Summing the connections is no better unless they
were busy at the same moments. So the meter keeps what each connection said it
moved and over which seconds (its busy time, ending when its last byte was
acknowledged: a connection read a round late still ended when it ended), lays them
on one clock in bins of ``BIN_S``, and reads each bin once no report can still
reach into it: the bytes every connection moved in the bin (each spread evenly
over its own seconds) over the time any of them was busy. That is what the link
carried while it was in use, a lower bound as each connection's own rate is,
read up to the link when enough of them overlap. The rate is then the second
best of the recent bins (``LinkEstimate``'s kernel samples), so one bin alone
cannot make it.

Transfers with learners inside the site (its own region: they never cross its
link) are the caller's to leave out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ddctl_agents.core.links import LinkEstimate

BIN_S = 1.0
"""How much of the clock one reading covers: at least a connection's longest window (``links.MAX_WINDOW_S``)."""
SETTLE_S = 6.0
"""A bin is read this long after it ends: a window is placed where it ended but reported later. A stream reads its
connection before its next record, at the latest at its keep-alive (5 s after the one before, ``keepalive_s``); an
upload reports when it ends. A window reported later than this loses what falls in bins already read."""
MAX_PENDING = 4096
"""Reports kept waiting for their bins to settle; past this the oldest go (a flood cannot grow the meter)."""


@dataclass(slots=True)
class SiteMeter:
    """One direction of a site's link (see the module docstring)."""

    estimate: LinkEstimate = field(default_factory=LinkEstimate)
    pending: list[tuple[float, float, int]] = field(default_factory=list)
    """(start, end, bytes) of each report whose last bin has not been read yet."""
    read_to: float = -math.inf
    """Every bin ending at or before this has been read."""

    def add(self, now: float, seconds: float, nbytes: int) -> None:
        """A connection moved ``nbytes`` in the ``seconds`` of busy time that ended ``now``; nonsense is ignored.

        Zero seconds is a transfer too short for the kernel's busy clock to tick (4 ms): its bytes count in their
        bin with no time of their own. Dropping them would read a fast link faster (what ticked, and none of what
        did not); kept, the bin's sum stays unbiased, as ``links.RatePool``'s does."""
        if not (math.isfinite(now) and math.isfinite(seconds) and 0 <= seconds <= 3600 and 0 < nbytes < 1 << 50):
            return
        start = max(now - seconds, self.read_to)  # what falls in bins already read is lost, not moved
        if start < now or (seconds == 0 and now >= self.read_to):
            self.pending.append((start, now, round(nbytes * (now - start) / seconds) if seconds else nbytes))
            del self.pending[:-MAX_PENDING]

    def read(self, now: float) -> None:
        """Read every bin that has settled into the estimate: one sweep over the reports in time order, so a meter
        left unread for long costs its reports and bins once, not their product."""
        last = _bin_start(now - SETTLE_S)  # bins ending at or before this have settled
        reports = sorted(self.pending)
        active: list[tuple[float, float, int]] = []
        i, left = 0, max(_bin_start(reports[0][0]), self.read_to) if reports else last  # a bin is read once
        while left < last and (i < len(reports) or active):
            right = left + BIN_S
            while i < len(reports) and reports[i][0] < right:
                active.append(reports[i])
                i += 1
            active = [r for r in active if r[1] >= left]  # one ending at ``left`` adds nothing but an instant there
            nbytes, busy = _in_bin(active, left, right)
            if busy > 0:
                self.estimate.observe(round(nbytes), busy, kernel=True)
            left = right if active else max(right, _bin_start(reports[i][0]) if i < len(reports) else last)
        self.read_to = max(self.read_to, last)
        self.pending = [p for p in self.pending if p[1] >= self.read_to]

    @property
    def bytes_per_s(self) -> float | None:
        return self.estimate.bytes_per_s


@dataclass(slots=True)
class SiteLinks:
    """Both directions of a site's link: ``up`` what leaves it (versions sent), ``down`` what arrives (updates)."""

    up: SiteMeter = field(default_factory=SiteMeter)
    down: SiteMeter = field(default_factory=SiteMeter)

    def read(self, now: float) -> None:
        self.up.read(now)
        self.down.read(now)


def _bin_start(t: float) -> float:
    return math.floor(t / BIN_S) * BIN_S


def _in_bin(reports: list[tuple[float, float, int]], left: float, right: float) -> tuple[float, float]:
    """(bytes moved in [left, right), seconds of it during which any report was busy)."""
    nbytes, spans = 0.0, []
    for start, end, n in reports:
        lo, hi = max(start, left), min(end, right)
        if start == end:
            nbytes += n if left <= end < right else 0
        elif hi > lo:
            nbytes += n * (hi - lo) / (end - start)
            spans.append((lo, hi))
    busy, reach = 0.0, -math.inf
    for lo, hi in sorted(spans):
        if hi > reach:
            busy += hi - max(lo, reach)
            reach = hi
    return nbytes, busy


__all__ = ["BIN_S", "SETTLE_S", "SiteLinks", "SiteMeter"]
