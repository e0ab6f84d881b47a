"""When a job is over: every learner has trained its budget, or the operator asked it to stop.

Pure decisions only; the service (``service/ending.py``) carries them out. A
learner leaves with ``FINISHED`` once it has trained (and pushed) its whole
share of the budget, or with ``STOPPED`` when the synchronizer asked it to
stop early; the job is over when every learner slot has finished and nothing
is left waiting in a round.
"""

from __future__ import annotations

from collections.abc import Collection

FINISHED = "finished"
"""A learner's leave reason once it has trained its share of the token budget."""
STOPPED = "stopped"
"""A learner's leave reason when the synchronizer asked it to stop (``ddctl stop``)."""

PHASES = ("training", "finishing", "finished")
"""A job trains, then finishes (learners push their last drift and leave, rounds close), then is finished."""


def budget_trained(finished: Collection[str], learners: int, live: Collection[str], pending: int) -> bool:
    """True once all ``learners`` slots left having finished, none is live and no round holds anything."""
    return learners > 0 and len(finished) >= learners and not live and pending == 0


def drained(live: Collection[str], pending: int) -> bool:
    """A stopping job may close: no learner is left to push, and every acknowledged update is merged or accounted."""
    return not live and pending == 0


def departed(reason: str) -> str:
    """A learner's state once it left on its own: ``finished``, ``stopped`` or ``left`` (preempted, SIGTERM, ...)."""
    return reason if reason in (FINISHED, STOPPED) else "left"
