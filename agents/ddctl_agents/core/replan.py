"""When to move fragments between shards: only for a large, repeated, predicted gain (pure).

Link measurements are noisy (±20% from one sample to the next is ordinary on a WAN),
and a handoff costs a fragment's state on the wire and a pause in its rounds. So the
syncer re-plans from every fresh link matrix but moves fragments only when the new
plan's busiest placement-dependent site is at least ``gain`` better than the current
assignment's, under the same measurements, ``confirmations`` times in a row, no sooner
than ``dwell_s`` after the last move, and at most ``max_moves`` fragments at once
(the ones that help most, one at a time, and none that does not help: the new plan
may number the same split differently). Nor while the busiest site is predicted under
``min_utilisation`` of its link: a link with room for the period's transfers twice
over is no bottleneck, and 20% of a load of 1% is noise (a CI run's two shards on
loopback, every site at 1%, moved a fragment just before the job's end).

The moves are damped: they stop once the busiest site is past both the gain and half
the way to the new plan. Readings of an overloaded site are low (its transfers queue
behind each other), so the plan an overload calls for overshoots; moving all the way
made a clean-clone CI run hand a fragment back 10 s later. If the rest of the way is
real, the next confirmed look moves it.

A move back waits longer. Right after a move the site that took fragments reads its new load, and a loaded
site reads slower than its link (its transfers queue), so the looks that follow can call for handing
fragments back: a CI run under load followed a move h1 -> h2 with a move back past the dwell. So a move from a site
that took fragments to the site that gave them waits ``RETURN_DWELLS`` dwell times after the move, not one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ddctl_agents.core.shardplan import (
    PlanSettings,
    ShardPlan,
    Traffic,
    placement_dependent,
    placement_loads,
    plan_shards,
)
from ddctl_agents.core.siteload import Site

RETURN_DWELLS = 3
"""How many dwell times a move that undoes a recent one (fragments back to the site that gave them) waits."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplanSettings:
    gain: float = 0.2
    """The predicted improvement of the busiest placement-dependent site, as a share of it."""
    confirmations: int = 3
    dwell_s: float = 300.0
    max_moves: int = 4
    min_utilisation: float = 0.5
    """The busiest placement-dependent site's predicted share of its link below which nothing moves."""

    def __post_init__(self) -> None:
        if not (0 < self.gain < 1 and self.confirmations >= 1 and self.dwell_s >= 0 and self.max_moves >= 1):
            raise ValueError("replan needs 0 < gain < 1, confirmations >= 1, dwell_s >= 0 and max_moves >= 1")
        if not 0 <= self.min_utilisation < 1:
            raise ValueError(f"replan needs 0 <= min_utilisation < 1, got {self.min_utilisation}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    fragment: int
    source: str
    target: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Replan:
    moves: tuple[Move, ...]
    before: float
    after: float
    """The busiest placement-dependent site's predicted utilisation before and after the moves."""
    cause: str


@dataclass(slots=True)
class Replanner:
    settings: ReplanSettings = ReplanSettings()
    streak: int = 0
    last_move: float = -math.inf
    current: float = math.nan
    """The last consideration's busiest placement-dependent site under today's assignment (what ``before`` would be)."""
    best: float = math.nan
    """...and under the plan the measurements call for."""
    barred: dict[tuple[str, str], float] = field(default_factory=dict)
    """(from, to) -> until when moves that way wait: the reverse of a recent move (see the module's docstring)."""

    def consider(
        self, now: float, sites: Sequence[Site], traffic: Traffic, site_of: Sequence[str], plan: PlanSettings
    ) -> Replan | None:
        """The moves to make now, given fresh measurements in ``sites`` and fragment f owned at ``site_of[f]``."""
        candidate = plan_shards(sites, traffic, plan)
        target = [candidate.site_of(f) for f in range(len(site_of))]
        now_profile = self._profile(sites, traffic, candidate, site_of)
        current, best = _busiest(now_profile), _busiest(self._profile(sites, traffic, candidate, target))
        self.current, self.best = current, best
        if current < self.settings.min_utilisation or current <= 0 or best > current * (1 - self.settings.gain):
            self.streak = 0
            return None
        self.streak += 1
        if self.streak < self.settings.confirmations or now - self.last_move < self.settings.dwell_s:
            return None
        moves, owned, profile = [], list(site_of), now_profile
        far_enough = min(current * (1 - self.settings.gain), (current + best) / 2)
        for _ in range(self.settings.max_moves):
            trials = {
                f: self._profile(sites, traffic, candidate, [*owned[:f], target[f], *owned[f + 1 :]])
                for f in range(len(owned))
                if owned[f] != target[f] and self.barred.get((owned[f], target[f]), -math.inf) <= now
            }
            chosen = min(trials, key=lambda f: (trials[f], f), default=None)
            if chosen is None or trials[chosen] >= profile:
                break  # the rest of the new plan's assignment is relabelling, not relief: no handoff for it
            moves.append(Move(fragment=chosen, source=owned[chosen], target=target[chosen]))
            owned[chosen], profile = target[chosen], trials[chosen]
            if _busiest(profile) <= far_enough:
                break
        if not moves:  # what would help is barred (a move back) or relabelling: no re-plan, and the looks start over
            self.streak = 0
            return None
        reached = _busiest(profile)
        self.streak, self.last_move = 0, now
        for move in moves:
            self.barred[(move.target, move.source)] = now + RETURN_DWELLS * self.settings.dwell_s
        cause = (
            f"busiest shard site predicted at {current:.0%} of its link, {best:.0%} with the new plan "
            f"(seen {self.settings.confirmations} times); {len(moves)} fragment(s) moved, {reached:.0%} after"
        )
        return Replan(moves=tuple(moves), before=current, after=reached, cause=cause)

    @staticmethod
    def _profile(sites: Sequence[Site], traffic: Traffic, plan: ShardPlan, site_of: Sequence[str]) -> tuple[float, ...]:
        """The placement-dependent sites' utilisations, busiest first: a move that leaves the busiest as it is but
        relieves the next one still helps (ties are common among equal links)."""
        found = placement_loads(sites, traffic, plan.cadence, plan.relay, site_of)
        return tuple(sorted(placement_dependent(found, plan.floor), reverse=True))


def _busiest(profile: tuple[float, ...]) -> float:
    """The busiest placement-dependent site of a profile (``placement_utilisation``), 0 when none depends on it."""
    return profile[0] if profile else 0.0
