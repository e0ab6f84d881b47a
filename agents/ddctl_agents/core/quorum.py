"""When may a fragment's round close? One pure decision with its reason.

The round closes once ``quorum`` learners have delivered. With grace on, the
syncer may wait a little longer, but only inside the network slack, so that no
learner's training is delayed (ALGORITHM.md §4.2):

    slack = overlap * step_time - (quorum_delay + sync_time)
    grace = clamp(gamma * slack, 0, cap_steps * step_time)

[ours] No cap by default: the slack itself bounds the window (below
``gamma * overlap`` steps). The paper's cap of about one step shut equal-speed
learners out of 25-40% of rounds: their uploads for a round arrive spread by up
to 1.3 step times (step-time jitter accumulates over H steps), and a learner
shut out lands its drift a round late.

[ours] WAN-aware: an absent learner is worth waiting for only if its predicted
arrival (from its step rate and its link's measured bandwidth) lands inside the
window; if none can, the round closes at once instead of idling to the deadline.
A live learner with no forecast yet (no upload measured: the first rounds of a
run, a new incarnation) may well be coming, so the window is waited out for it.
Time always arrives as an argument; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ddctl_agents.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class QuorumConfig:
    """Quorum and grace-window knobs."""

    quorum: int = 1
    """K: updates needed before a round may close (K = M is synchronous training)."""
    grace: bool = True
    """Wait for more learners inside the network slack once the quorum is met."""
    overlap: int = 2
    """tau: inner steps a learner keeps training while its fragment is in flight."""
    gamma: float = 0.8
    """[ours] Safety margin on the slack (< 1)."""
    cap_steps: float | None = None
    """[ours] The window never exceeds this many step times (None: the slack alone bounds it)."""

    def __post_init__(self) -> None:
        if self.quorum < 1:
            raise ConfigError(f"quorum must be >= 1, got {self.quorum}")
        if self.overlap < 0:
            raise ConfigError(f"overlap must be >= 0, got {self.overlap}")
        if not 0 < self.gamma <= 1:
            raise ConfigError(f"grace gamma must be in (0, 1], got {self.gamma}")
        if self.cap_steps is not None and self.cap_steps < 0:
            raise ConfigError(f"grace cap must be >= 0 steps, got {self.cap_steps}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundView:
    """What the decision needs to know about one open round."""

    opened_at: float
    """When the round's first update arrived."""
    arrived: frozenset[str]
    """Learners whose update for this round is in."""
    live: frozenset[str]
    """Learners currently registered (who could still contribute)."""
    quorum_met_at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """Estimates the shell maintains from heartbeats and measured transfers."""

    step_time: float
    """xi_step: robust (median) inner step time of the waiting learners, seconds."""
    sync_time: float = 0.0
    """xi_sync: time to merge and send the fragment back, seconds."""
    forecasts: Mapping[str, float] = field(default_factory=dict)
    """Absent learner -> predicted arrival time of its update (absolute seconds); an absent learner
    missing here has no forecast yet, and the window is waited out for it."""


CAUSES = ("quorum_wait", "grace_wait", "all_arrived", "grace_off", "grace_over", "none_coming", "final_drain")
"""Why a round waits (first two) or closes; final_drain: the shell ends the run, or no live learner remains."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundDecision:
    """Close now or wait; ``wake_at`` says when to ask again if nothing arrives.

    ``cause`` is a stable code for counting (see CAUSES); ``reason`` the sentence for people.
    """

    close: bool
    cause: str
    reason: str
    grace_s: float = 0.0
    wake_at: float | None = None


def grace_window(quorum_delay: float, timing: Timing, config: QuorumConfig) -> float:
    """clamp(gamma * (tau*xi_step - (xi_quorum + xi_sync)), 0, cap)."""
    slack = config.overlap * timing.step_time - (quorum_delay + timing.sync_time)
    window = max(config.gamma * slack, 0.0)
    return window if config.cap_steps is None else min(window, config.cap_steps * timing.step_time)


def decide_round(now: float, view: RoundView, timing: Timing, config: QuorumConfig) -> RoundDecision:
    """Decide whether the round closes at ``now``, and say why."""
    present = len(view.arrived)
    needed = min(config.quorum, max(1, len(view.live | view.arrived)))
    if present < needed:
        return RoundDecision(close=False, cause="quorum_wait", reason=f"waiting for quorum {present}/{needed}")
    lowered = " (quorum lowered to live learners)" if needed < config.quorum else ""
    absent = sorted(view.live - view.arrived)
    if not absent:
        return RoundDecision(close=True, cause="all_arrived", reason=f"all {present} live learners arrived{lowered}")
    if not config.grace:
        return RoundDecision(close=True, cause="grace_off", reason=f"quorum {present}/{needed} met, grace off{lowered}")
    met_at = now if view.quorum_met_at is None else view.quorum_met_at
    window = grace_window(met_at - view.opened_at, timing, config)
    deadline = met_at + window
    if now >= deadline:
        return RoundDecision(
            close=True,
            cause="grace_over",
            reason=f"grace {window:.3f}s over with {present}/{present + len(absent)}",
            grace_s=window,
        )
    coming = sorted((timing.forecasts.get(m, deadline), m) for m in absent if timing.forecasts.get(m, deadline) <= deadline)
    if not coming:
        return RoundDecision(
            close=True,
            cause="none_coming",
            reason=f"quorum {present}/{needed} met; no absent learner can arrive within grace {window:.3f}s",
            grace_s=window,
        )
    eta, who = coming[0]
    due = f"due in {eta - now:.3f}s" if who in timing.forecasts else "no forecast yet"
    return RoundDecision(
        close=False,
        cause="grace_wait",
        reason=f"grace: waiting up to {window:.3f}s for {who} ({due})",
        grace_s=window,
        wake_at=deadline,
    )
