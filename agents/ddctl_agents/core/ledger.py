"""Where every trained token went, so that none can silently vanish.

Units are fragment-tokens: a token trained on a learner counts once for each
fragment it moved (its drift leaves with each fragment separately); reports
divide by the fragment count to give tokens. The syncer's side must balance:
``received == merged + late_merged + dropped + rejected + pending``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class TokenLedger:
    received: int = 0
    """Fragment-tokens in updates the syncer acknowledged."""
    merged: int = 0
    """Merged in the round they were sent for."""
    late_merged: int = 0
    """Arrived after their round closed and were folded into the next one."""
    dropped: int = 0
    """Too stale to fold; the learner was told to resync."""
    pending: int = 0
    """Acknowledged, waiting in an open round."""
    rejected: int = 0
    """Acknowledged, then set aside at a merge: the result would have been non-finite or out of
    bounds with it, or the round failed (docs/design.md, trust boundary)."""

    def balanced(self) -> bool:
        return self.received == self.merged + self.late_merged + self.dropped + self.rejected + self.pending

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def as_tokens(self, fragments: int) -> dict[str, float]:
        return {k: v / fragments for k, v in self.as_dict().items()}
