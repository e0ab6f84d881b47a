"""What a round's grace decision needs to know: step time, merge-and-send time, absent learners' arrivals.

Pure: everything comes from the syncer's per-learner estimates (``core/links.py``)
and the schedule. A learner's next send of a fragment is the due step it last
reported; before its first report it is the schedule's, at that learner's own
cadence (a learner sending every k-th period is not expected every period).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ddctl_agents.core import schedule
from ddctl_agents.core.links import LearnerLinks
from ddctl_agents.core.quorum import Timing
from ddctl_agents.core.rounds import Round


def round_timing(
    now: float,
    p: int,
    rnd: Round,
    live: Iterable[str],
    links_of: Callable[[str], LearnerLinks],
    fragments: int,
    periods: Mapping[str, int],
) -> Timing:
    """``periods``: each learner's inner steps between two sends of a fragment (H times its cadence)."""
    arrived = [links_of(m).pace.step_time for m in rnd.fresh]
    known = [t for t in arrived if t is not None]
    step_time = min(known) if known else 0.0
    forecasts: dict[str, float] = {}
    for m in live:
        if m in rnd.fresh:
            continue
        links = links_of(m)
        due = (
            links.pace.due[p]
            if len(links.pace.due) > p
            else schedule.next_due_step(links.pace.last_step, p, fragments, periods[m])
        )
        eta = links.predict_arrival(now, due, rnd.upload_bytes, p)
        if eta is not None:
            forecasts[m] = eta
    sync = [links_of(m).down.transfer_time(rnd.upload_bytes) for m in rnd.fresh]
    sync_time = max((s for s in sync if s is not None), default=0.0)
    return Timing(step_time=step_time, sync_time=sync_time, forecasts=forecasts)
