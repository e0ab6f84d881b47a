"""A learner whose synchronizer started over starts over too, in the same process.

Every version such a learner holds is of a history the synchronizer will never continue
(``service/history.py``): each update it sends is refused as based on a version the synchronizer
never produced, and no version it is sent is newer than the ones it holds. Training on would cost
the machine and add nothing, so its run ends (``STARTED_OVER``) and it begins again from
registration, a fresh learner of the new history, on the same machine. Under torchrun the ranks
end with ``EXIT_RESTART`` and the launcher runs them again. Past ``MOST_RESTARTS`` in one process
the learner exits with ``EXIT_RESTART`` and its machine is replaced.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from ddctl_agents.entrypoint import EXIT_OK, EXIT_UNREACHABLE

log = logging.getLogger(__name__)

STARTED_OVER = "syncer_started_over"
"""The reason a run ends when the versions it holds can never be continued."""
EXIT_RESTART = 75
"""EX_TEMPFAIL: the run ended because its synchronizer started over; running it again is the remedy."""
MOST_RESTARTS = 5
"""Runs started again in one process at most: a synchronizer that keeps losing its state needs its operator."""


def rerun_summaries(run: Callable[[int], dict[str, Any]], stopping: Callable[[], bool]) -> dict[str, Any]:
    """``run(restarts)`` (one learner run, its summary), again while it ends because its synchronizer started over; the
    last summary. Under torchrun a rank runs once: the launcher runs the ranks again (``rerun_codes``)."""
    summary, restarts = run(0), 0
    alone = int(os.environ.get("WORLD_SIZE", "1") or 1) == 1
    while alone and summary.get("reason") == STARTED_OVER and restarts < MOST_RESTARTS and not stopping():
        restarts += 1
        log.warning("the synchronizer started over: learning again from its versions (restart %d of %d)", restarts,
                    MOST_RESTARTS)  # fmt: skip
        summary = run(restarts)
    return summary


def rerun_codes(run: Callable[[], int]) -> int:
    """``run`` (torchrun's ranks, their exit code), again while they end with ``EXIT_RESTART``; the last code. A
    signal the launcher passes on ends the ranks with 0, so a stopped learner is not run again."""
    code, restarts = run(), 0
    while code == EXIT_RESTART and restarts < MOST_RESTARTS:
        restarts += 1
        log.warning("the synchronizer started over: running the ranks again (restart %d of %d)", restarts, MOST_RESTARTS)
        code = run()
    return code


def exit_code(summary: dict[str, Any]) -> int:
    """The learner's exit code from its summary: the dead-man switch ends as unreachable (ddctl's 6), a run whose
    synchronizer started over (once too often, or a rank under torchrun) with ``EXIT_RESTART``."""
    return {"syncer_gone": EXIT_UNREACHABLE, STARTED_OVER: EXIT_RESTART}.get(str(summary.get("reason")), EXIT_OK)
