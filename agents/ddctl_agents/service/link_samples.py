"""Where a link sample the HTTP layer took goes: the rate estimates of its learner and region, and the site's meter.

Runs on the core thread (``SyncerRuntime.observe_link`` submits it), which owns every estimate it touches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ddctl_agents.relay import region_of

if TYPE_CHECKING:
    from ddctl_agents.service.runtime import SyncerRuntime


class LinkSample(NamedTuple):
    learner: str
    """A learner, or a relay's identity (whose stream is the downlink of its region's learners behind it)."""
    direction: str
    """"up" (the learner sent) or "down" (it was sent)."""
    nbytes: int
    seconds: float
    kernel: bool
    """Timed by TCP_INFO (bytes acknowledged over busy time), not by the application's reads."""
    ended: float
    """When its last byte crossed, on the runtime's clock."""


def observe(rt: SyncerRuntime, sample: LinkSample, rate: bool, site: bool) -> None:
    """``rate``: into the learner's and its region's estimates; ``site``: onto the site meter's clock, at ``ended``.

    A stream's pooled samples go to the rates and its single windows to the site: the pool spans several versions,
    which the site's clock must see where each one crossed."""
    learner, direction, nbytes, seconds, kernel, ended = sample
    if (region := region_of(learner)) is not None:
        if rate:
            rt.streams.observe(region, rt.roster.info, rt.syncer.live, rt.syncer.links, nbytes, seconds, kernel)
    elif (links := rt.syncer.links.get(learner)) is not None:
        for both in (links, rt.roster.regional(learner)) if rate else ():
            (both.up if direction == "up" else both.down).observe(nbytes, seconds, kernel=kernel)
        if site:
            rt.roster.crossed(learner, direction, ended, seconds, nbytes)
