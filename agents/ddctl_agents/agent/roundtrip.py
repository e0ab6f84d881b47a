"""How long a learner waits for the synchronizer: from sending a fragment to adopting its next version.

A learner sends fragment p's drift when it is due, trains on, and adopts p's next
version when it arrives; what it trained on p in between is overwritten. That wait
is what a slow or overloaded link costs in work, so ``bench wan`` reports it per
region. ``observe`` is pure bookkeeping on times the loop passes in (one step's
granularity); the send is counted from the step after it was started, the version
is the first of that fragment adopted after it (for a learner at cadence 1 this may
be a round its update missed, in which case the wait reads shorter than it was).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

MAX_SAMPLES = 100_000


@dataclass(slots=True)
class RoundTrips:
    """Send-to-adoption waits, fragment by fragment."""

    waiting: dict[int, float] = field(default_factory=dict)
    """Fragment -> when its oldest unanswered send was seen."""
    seconds: list[float] = field(default_factory=list)
    _seen: int = 0

    def observe(self, now: float, sent: Sequence[bool], adoptions: Sequence[tuple[int, int, int]]) -> None:
        """``sent[p]``: p has been sent since its last adoption; ``adoptions``: every adoption so far, oldest first."""
        for fragment, _, _ in adoptions[self._seen :]:
            began = self.waiting.pop(fragment, None)
            if began is not None and len(self.seconds) < MAX_SAMPLES:
                self.seconds.append(now - began)
        self._seen = len(adoptions)
        for fragment, flag in enumerate(sent):
            if flag and fragment not in self.waiting:
                self.waiting[fragment] = now

    def summary(self) -> dict[str, float | int | None]:
        """Count, p50 and p95 of the waits, seconds."""
        if not self.seconds:
            return {"count": 0, "p50_s": None, "p95_s": None}
        ordered = sorted(self.seconds)
        p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
        return {"count": len(ordered), "p50_s": round(statistics.median(ordered), 4), "p95_s": round(p95, 4)}


__all__ = ["RoundTrips"]
