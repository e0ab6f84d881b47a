"""What the service knows about learners and regions beyond the core's state, and its event log.

The core keeps what decides rounds; the roster keeps what people read on the
status page: each learner's region, progress and state, link estimates per
region, and the recent events and rounds. Touched only on the core thread.
Everything in it is bounded: learners are the job's identities, regions are
capped, the logs are rings.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from ddctl_agents.core.links import LearnerLinks
from ddctl_agents.core.sitemeter import SiteLinks
from ddctl_agents.errors import BadRequest
from ddctl_agents.service.requests import HeartbeatBody

log = logging.getLogger(__name__)
ROUND_FIELDS = ("t", "fragment", "version", "cause", "reason", "grace_s", "admitted")
MAX_REGIONS = 256
"""Distinct region names the service keeps link estimates for; a learner cannot make it keep more."""
ROUNDS_LOG_EVERY_S = 10.0
"""Seconds between two INFO lines summing up the rounds closed (one line per round would flood the log)."""
LOGGED_ELSEWHERE = frozenset({"snapshot", "rejected", "suspended", "task-failed", "fragment-degraded", "finishing", "finished"})
"""Events not logged as events: snapshots are routine, the others are logged with their detail where they happen."""


@dataclass(slots=True)
class LearnerInfo:
    """What the status page shows about one learner, beside the core's link estimates."""

    region: str = ""
    incarnation: int = 0
    state: str = "training"
    step: int = 0
    tokens: int = 0
    """Tokens this life of the learner has trained (its heartbeats say)."""
    tokens_before: int = 0
    """Tokens its earlier lives trained, as far as this syncer heard."""
    tokens_per_s: float = 0.0
    """All its ranks together."""
    accelerator: str = ""
    """One rank's device, "cpu", or "" until a heartbeat says (each heartbeat refreshes it, as after a re-register)."""
    devices: int = 1
    memory_gb: float = 0.0
    uploads_in_flight: int = 0
    """As its last heartbeat said (0: not said)."""
    loss: float | None = None
    staleness: int = 0
    last_seen: float = 0.0
    joined_at: float = 0.0
    updates: dict[str, int] = field(default_factory=dict)
    known_since: float = 0.0
    """When this process first knew it (it joined, or was recovered from the log)."""
    train_s: float = 0.0
    """Seconds its lives spent training while this syncer process heard them (what its heartbeats' ``train_s`` rose
    by), never more than ``known_since`` ago: the job's goodput."""
    train_said: float | None = None
    """The ``train_s`` its life last said (0 for a life that began here); None for a learner recovered from the log
    until its first heartbeat, which includes training before this process began and so only sets where it counts from."""
    train_heard: bool = False
    """A heartbeat said ``train_s`` (an agent too old to never does)."""


class Roster:
    def __init__(self, site: str = "") -> None:
        self.info: dict[str, LearnerInfo] = {}
        self.regions: dict[str, LearnerLinks] = {}
        self.site, self.site_links = site, SiteLinks()
        """The region this service runs in, and its link as every transfer across it measured it (``core/sitemeter``)."""
        self.together: dict[str, SiteLinks] = {}
        """Per region, its learners' transfers with this service all at once: ``up`` their uploads, ``down`` versions."""
        self.events: deque[dict[str, Any]] = deque(maxlen=64)
        self.recent_rounds: deque[dict[str, Any]] = deque(maxlen=32)
        self._rounds: Counter[str] = Counter()
        self._rounds_logged_at: float | None = None

    def event(self, now: float, kind: str, **fields: Any) -> None:
        """An event for the page, and (joins, leaves, recoveries...) a line in the service's log."""
        self.events.append({"t": round(now, 3), "event": kind, **fields})
        if kind not in LOGGED_ELSEWHERE:
            level = logging.WARNING if kind == "set-aside" else logging.INFO
            log.log(level, "%s %s", kind, " ".join(f"{k}={_shown(v)}" for k, v in fields.items()))

    def _round_closed(self, now: float, record: dict[str, Any]) -> None:
        """Count the round; every ``ROUNDS_LOG_EVERY_S`` log how many closed since the last line, and why."""
        self._rounds[str(record["cause"])] += 1
        if self._rounds_logged_at is None:
            self._rounds_logged_at = now
        elif now - self._rounds_logged_at >= ROUNDS_LOG_EVERY_S:
            causes = ", ".join(f"{cause} {n}" for cause, n in self._rounds.most_common())
            live = sum(info.state == "training" for info in self.info.values())
            log.info(
                "%d rounds in %.0f s (%s); fragment %s at version %s; %d learners training",
                self._rounds.total(),
                now - self._rounds_logged_at,
                causes,
                record["fragment"],
                record["version"],
                live,
            )
            self._rounds.clear()
            self._rounds_logged_at = now

    def learner(self, name: str) -> LearnerInfo:
        return self.info.setdefault(name, LearnerInfo())

    def region_of(self, name: str) -> str:
        return self.info[name].region if name in self.info else ""

    def check_region(self, region: str) -> None:
        if region not in self.regions and len(self.regions) >= MAX_REGIONS:
            raise BadRequest(f"this job already tracks {MAX_REGIONS} regions; {region!r} would be one more")

    def joined(self, now: float, name: str, incarnation: int, region: str, start_step: int, links: LearnerLinks) -> None:
        """A learner registered: a learner new to its link starts from its region's estimates."""
        regional = self.regions.get(region)
        if regional is not None and links.up.bytes_per_s is None:
            links.up.bytes_per_s, links.up.rtt_s = regional.up.bytes_per_s, regional.up.rtt_s
        new, info = name not in self.info, self.learner(name)
        if info.incarnation != incarnation:  # a new life: the old one's tokens stay counted
            info.tokens_before, info.tokens = info.tokens_before + info.tokens, 0
        if new or info.incarnation != incarnation:  # a life that began here: all its training counts
            info.train_said = 0.0
        if new:
            info.known_since = now
        info.region, info.incarnation, info.state, info.last_seen, info.joined_at = region, incarnation, "training", now, now
        info.step = max(info.step, start_step)
        self.event(now, "join", learner=name, region=region, incarnation=incarnation, start_step=start_step)

    def recovered(self, now: float, name: str, incarnation: int) -> None:
        """A learner live in the log this process recovered: known from now, its region unknown until it says."""
        self.info[name] = LearnerInfo(incarnation=incarnation, last_seen=now, joined_at=now, known_since=now, state="recovered")

    def heard(self, now: float, report: HeartbeatBody, links: LearnerLinks) -> tuple[LearnerLinks, LearnerLinks]:
        """A heartbeat: progress for the page; returns (learner's, region's) links for the measured figures. Its region
        counts only where the roster has none (a learner recovered from the log), never to move a registered one."""
        info = self.learner(report.learner)
        if not info.region and report.region:
            self.check_region(report.region)
            info.region = report.region
        info.step, info.tokens, info.tokens_per_s = report.step, report.tokens, report.tokens_per_s
        info.loss, info.staleness, info.last_seen, info.state = report.loss, report.staleness, now, "training"
        info.accelerator, info.devices, info.memory_gb = report.accelerator, report.devices, report.memory_gb
        info.uploads_in_flight = report.uploads_in_flight
        if report.train_s is not None:
            trained(info, now, report.train_s)
        return links, self.regions.setdefault(info.region, LearnerLinks())

    def regional(self, name: str) -> LearnerLinks:
        return self.regions.setdefault(self.region_of(name), LearnerLinks())

    def crossed(self, name: str, direction: str, at: float, seconds: float, nbytes: int) -> None:
        """A sample of learner ``name``'s ``direction`` link, read at ``at``: the site's link carried it (the other way
        round: a learner's downlink is what leaves the site), and so did its region's, unless the learner is inside the
        site (then no link did)."""
        region = self.region_of(name)
        if self.site and region == self.site:
            return
        (self.site_links.up if direction == "down" else self.site_links.down).add(at, seconds, nbytes)
        if region in self.regions:  # a region the roster tracks (capped), so this cannot grow without bound
            together = self.together.setdefault(region, SiteLinks())
            (together.up if direction == "up" else together.down).add(at, seconds, nbytes)

    def set_state(self, name: str, state: str) -> None:
        if name in self.info:
            self.info[name].state = state

    def note(self, now: float, record: dict[str, Any]) -> None:
        """What a tape record means for the page: a round closed, a contribution set aside, a learner suspended."""
        kind = record["type"]
        if kind == "round":
            self.recent_rounds.append({k: record[k] for k in ROUND_FIELDS})
            self._round_closed(now, record)
        elif kind == "reject":
            self.event(now, "set-aside", learner=record["learner"], fragment=record["fragment"], reason=record["reason"])
        elif kind == "suspend":
            self.event(now, "suspended", learner=record["learner"], reason=record["reason"])
            self.set_state(record["learner"], "suspended")
            log.error("learner %s suspended: %s", record["learner"], record["reason"])


def counted(info: LearnerInfo) -> float | None:
    """The seconds of ``info``'s training this process counted, or None where no heartbeat said any."""
    return round(info.train_s, 3) if info.train_heard else None


def trained(info: LearnerInfo, now: float, said: float) -> None:
    """Count what a heartbeat's ``train_s`` rose by since the last one said. A figure below the last is a life that
    began since (its learner registered again, or restarted before this syncer heard of it): all of it counts. The
    total stays within the time this process has known the learner, whatever a learner claims."""
    if info.train_said is not None:
        info.train_s += said - info.train_said if said >= info.train_said else said
        info.train_s = min(info.train_s, max(0.0, now - info.known_since))
    info.train_said, info.train_heard = said, True


def _shown(value: Any) -> Any:
    """A field's value in a ``key=value`` log line, quoted where it has a space, ``=`` or ``"`` (a learner's leave
    reason ``left learner=L9`` read as two more fields)."""
    return json.dumps(value) if isinstance(value, str) and (not value or any(c in value for c in ' ="')) else value
