"""One fragment's open round, and the bounded memory of update ids that makes retries idempotent."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ddctl_agents.core.merge import Contribution
from ddctl_agents.core.packed import PackedSum, packed_parts


@dataclass(slots=True)
class RecentIds:
    """A learner's last ``size`` update ids: retries arrive soon after the original, so a
    bounded window per learner deduplicates them without growing with the run."""

    size: int = 4096
    order: deque[str] = field(default_factory=deque)
    ids: set[str] = field(default_factory=set)

    def __contains__(self, update_id: object) -> bool:
        return update_id in self.ids

    def add(self, update_id: str) -> None:
        self.order.append(update_id)
        self.ids.add(update_id)
        if len(self.order) > self.size:
            self.ids.discard(self.order.popleft())


@dataclass(slots=True)
class Round:
    """Contributions waiting for a fragment's next version: fresh (sent for it) and late (folded in)."""

    opened_at: float | None = None
    quorum_met_at: float | None = None
    wake_at: float | None = None
    fresh: dict[str, Contribution] = field(default_factory=dict)
    late: dict[str, Contribution] = field(default_factory=dict)
    upload_bytes: int = 0

    def by_learner(self) -> list[Contribution]:
        """One contribution per learner: a learner both late and fresh in a round counts once."""
        merged: dict[str, Contribution] = dict(self.late)
        for m, c in self.fresh.items():
            merged[m] = accumulate(merged.get(m), c)
        return list(merged.values())

    def tokens(self, learners: set[str] | None = None) -> tuple[int, int]:
        """(fresh, late) fragment-tokens of ``learners`` (all when None)."""

        def total(side: dict[str, Contribution]) -> int:
            return sum(c.c_tokens for m, c in side.items() if learners is None or m in learners)

        return total(self.fresh), total(self.late)


def accumulate(previous: Contribution | None, new: Contribution) -> Contribution:
    """Two updates of one learner for one round are consecutive drifts: add them (still packed where both are, so
    the round stays on the fused path)."""
    if previous is None:
        return new
    before, after = packed_parts(previous.tensors), packed_parts(new.tensors)
    tensors: Mapping[str, torch.Tensor]
    if before is not None and after is not None:
        tensors = PackedSum((*before, *after))
    else:
        tensors = {k: previous.tensors[k] + new.tensors[k] for k in new.tensors}
    return Contribution(
        learner=new.learner,
        tensors=tensors,
        c_steps=previous.c_steps + new.c_steps,
        c_tokens=previous.c_tokens + new.c_tokens,
        periods=new.periods,
        stale=max(previous.stale, new.stale),  # the sum is as old as its oldest part
    )
