"""Quarantine the sender, not the job: each learner's record of refused updates.

Every update refused for its content (layout, NaN/Inf, implausible magnitude or
counters) and every contribution set aside at a merge counts against its
learner. After ``max_rejections`` of them the learner is suspended: it no longer
counts toward quorum and its requests are refused (403) until an operator
readmits it, which clears its record. Other learners never notice. Pure state,
captured in snapshots and rebuilt by log replay like the rest of the syncer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Standing:
    """One learner's record since it was last admitted."""

    rejections: int = 0
    last_reason: str = ""
    suspended: str | None = None
    """Why it is suspended, while it is."""


@dataclass(slots=True)
class Quarantine:
    max_rejections: int
    """Rejections that suspend a learner; 0 never suspends."""
    standings: dict[str, Standing] = field(default_factory=dict)

    def flag(self, learner: str, reason: str) -> bool:
        """Count one rejection; True when this one suspends the learner."""
        standing = self.standings.setdefault(learner, Standing())
        standing.rejections += 1
        standing.last_reason = reason
        if standing.suspended is None and self.max_rejections and standing.rejections >= self.max_rejections:
            standing.suspended = f"{standing.rejections} rejected updates, the last: {reason}"
            return True
        return False

    def suspension(self, learner: str) -> str | None:
        standing = self.standings.get(learner)
        return None if standing is None else standing.suspended

    def readmit(self, learner: str) -> bool:
        """Clear the learner's record; False if it was not suspended."""
        standing = self.standings.pop(learner, None)
        return standing is not None and standing.suspended is not None

    def suspended(self) -> list[str]:
        return sorted(m for m, s in self.standings.items() if s.suspended is not None)

    def to_json(self) -> dict[str, Any]:
        return {
            m: {"rejections": s.rejections, "last_reason": s.last_reason, "suspended": s.suspended}
            for m, s in self.standings.items()
        }

    def load_json(self, data: dict[str, Any]) -> None:
        self.standings = {
            m: Standing(rejections=int(s["rejections"]), last_reason=str(s["last_reason"]), suspended=s["suspended"])
            for m, s in data.items()
        }
