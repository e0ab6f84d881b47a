"""The running re-planner: the links as the shards measure them, and fragments moved when the plan says so.

Every few seconds it reads each shard's status, turns what the shards measured
into the scheduler's sites (``measured_sites``), asks ``core/replan.py`` whether
moving fragments is worth it (a large gain, seen several times in a row, past a
dwell time) and carries the moves out as ordinary handoffs (``control/handoff.py``).
Once a shard says the job is finishing nothing moves: the learners are done, and a
fragment in the middle of a handoff is owned by no shard when the final model is joined.

What a shard measures is one learner's transfers to or from it (``core/links.py``:
kernel-timed, the second best of the recent samples). A transfer between a shard
at site S and a learner in region R crosses both sites' links, so its rate is a
lower bound of R's link and of S's, each in its direction: a learner's upload
bounds R's uplink and S's downlink, a version sent to it bounds S's uplink and
R's downlink. A site's link is the best of its bounds; where no transfer crossed it,
its prior (the declared link) scaled the way the measured sites read against theirs.
Traffic inside one site crosses no link and says nothing. The learners' cadences are what runs (a learner's is fixed for its
life), so the re-planner moves fragments between the running shards and nothing else.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeGuard

from ddctl.control.handoff import move
from ddctl.control.shard_status import gather
from ddctl.errors import DdctlError
from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.core import shardmap
from ddctl_agents.core.links import MAX_RATE
from ddctl_agents.core.replan import Replan, Replanner, ReplanSettings
from ddctl_agents.core.schedule import CADENCES
from ddctl_agents.core.shardplan import PlanSettings, Traffic
from ddctl_agents.core.siteload import Site

if TYPE_CHECKING:
    from ddctl.config.regions import RegionsFile
    from ddctl_agents.train.job import JobConfig

MAX_STEP_S = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Crossing:
    """What one shard measured of one region's learners: bytes per second each way (None: not measured yet)."""

    shard_site: str
    region: str
    up: float | None
    """The learners' uploads to the shard."""
    down: float | None
    """The versions the shard sent them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Seen:
    """One shard's status, reduced to what the re-planner acts on (checked: it came from another process)."""

    site: str
    crossings: tuple[Crossing, ...]
    steps: dict[str, list[float]]
    """Region -> its live learners' measured step times."""
    cadence: dict[str, int]
    """Region -> the cadence its live learners run at."""


def read_status(status: Any, site: str, regions: set[str]) -> Seen:
    """``status`` (``GET /v1/status`` of the shard at ``site``) checked in type and range: a row or figure that is
    not what it should be is left out, so one bad answer can neither stop the loop nor move a fragment."""
    rows = status.get("regions") if isinstance(status, dict) else None
    learners = status.get("learners") if isinstance(status, dict) else None
    crossings = [
        Crossing(shard_site=site, region=row["name"], up=_rate(row.get("up_mbps")), down=_rate(row.get("down_mbps")))
        for row in (rows if isinstance(rows, list) else [])
        if isinstance(row, dict) and isinstance(row.get("name"), str) and row["name"] in regions
    ]
    steps: dict[str, list[float]] = {}
    cadence: dict[str, int] = {}
    for row in learners if isinstance(learners, list) else []:
        if not isinstance(row, dict) or not isinstance(region := row.get("region"), str) or region not in regions:
            continue
        if row.get("live") is not True:
            continue
        if _number(step := row.get("step_time_s")) and 0 < step <= MAX_STEP_S:
            steps.setdefault(region, []).append(float(step))
        if (k := row.get("cadence")) in CADENCES and isinstance(k, int) and not isinstance(k, bool):
            cadence[region] = max(cadence.get(region, 1), k)
    return Seen(site=site, crossings=tuple(crossings), steps=steps, cadence=cadence)


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _rate(mbps: Any) -> float | None:
    """Mbit/s as a shard reports it -> bytes per second; None for a missing or impossible figure."""
    if not _number(mbps) or not 0 < mbps * 1e6 / 8 <= MAX_RATE:
        return None
    return float(mbps) * 1e6 / 8


Bounds = tuple[dict[str, float], dict[str, float]]
"""Each site's best lower bound of its uplink, and of its downlink, bytes per second."""


def link_bounds(crossings: Sequence[Crossing]) -> Bounds:
    """Each site's best lower bound of its uplink and of its downlink, bytes per second (see the module docstring)."""
    up: dict[str, float] = {}
    down: dict[str, float] = {}

    def bound(into: dict[str, float], site: str, rate: float) -> None:
        into[site] = max(into.get(site, 0.0), rate)

    for c in crossings:
        if c.region == c.shard_site:
            continue  # inside one site: no link crossed
        if c.up is not None:
            bound(up, c.region, c.up)
            bound(down, c.shard_site, c.up)
        if c.down is not None:
            bound(down, c.region, c.down)
            bound(up, c.shard_site, c.down)
    return up, down


def measured_sites(
    priors: Sequence[Site],
    bounds: Bounds,
    steps: Mapping[str, Sequence[float]],
    hosts: set[str],
) -> list[Site]:
    """The priors with each link measured replaced by its bound, each step by its learners' median, and only
    ``hosts`` (the sites running a shard) as candidates.

    A site nothing has crossed yet (a shard just restarted has no measurements) keeps its prior scaled the way the
    measured sites' bounds read against theirs (the median ratio, per direction): the bounds read low where a
    version fans out to several learners at once, and a bare prior beside them would look several times faster
    than it is, drawing every fragment to it."""
    up, down = bounds
    up_ratio, down_ratio = _bias(priors, up, "up_bytes_s"), _bias(priors, down, "down_bytes_s")
    return [
        replace(
            site,
            up_bytes_s=up.get(site.name, site.up_bytes_s * up_ratio),
            down_bytes_s=down.get(site.name, site.down_bytes_s * down_ratio),
            step_s=statistics.median(steps[site.name]) if steps.get(site.name) else site.step_s,
            candidate=site.name in hosts,
        )
        for site in priors
    ]


def _bias(priors: Sequence[Site], measured: Mapping[str, float], direction: str) -> float:
    """How the measured links read against their priors: the median ratio (1 when nothing is measured)."""
    ratios = [measured[s.name] / getattr(s, direction) for s in priors if s.name in measured]
    return statistics.median(ratios) if ratios else 1.0


@dataclass(slots=True)
class Replanning:
    """The re-planner of one running sharded job: ``tick`` reads the shards, decides, and moves what it decided."""

    urls: list[str]
    connect: Callable[[str], SyncerClient]
    sites_of_shards: dict[str, str]
    """Shard name -> the site (region) it runs in."""
    priors: list[Site]
    traffic: Traffic
    relays: bool
    planner: Replanner
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        names = {s.name for s in self.priors}
        unknown = sorted(site for site in self.sites_of_shards.values() if site not in names)
        if unknown:
            raise DdctlError(
                f"shards placed at {', '.join(unknown)}, which is not a region of the job; allowed: {', '.join(sorted(names))}"
            )
        if not self.sites_of_shards:
            raise DdctlError("name every shard's site (S0=REGION, ...): the re-planner moves fragments between sites")

    def tick(self) -> dict[str, Any]:
        """One look at the job: the measured sites, the decision, and the moves made (see the module docstring)."""
        now = self.clock()
        routes, own = self._maps()
        unknown = sorted(set(routes) - set(self.sites_of_shards))
        if unknown:
            raise DdctlError(f"no site given for shard(s) {', '.join(unknown)}; give --site SHARD=REGION for each")
        newest = max(own.values(), key=lambda m: m.epoch)
        finished = self._finish_handoffs(newest, own)
        answers = gather([routes[s] for s in sorted(routes)], self.connect, check=None)  # read_status checks it
        down = [url for url, status, _ in answers if status is None]
        if down:
            return {"t": now, "epoch": newest.epoch, "finished": finished, "skipped": f"unreachable: {', '.join(down)}"}
        if any(_ending(status) for _, status, _ in answers):  # a move now gains nothing and races the final model's join
            return {"t": now, "epoch": newest.epoch, "finished": finished, "skipped": "the job is finishing"}
        site_of_url = {routes[s]: self.sites_of_shards[s] for s in routes}
        regions = {s.name for s in self.priors}
        seen = [read_status(status, site_of_url[url], regions) for url, status, _ in answers]
        hosts = set(self.sites_of_shards.values())
        bounds = link_bounds([c for s in seen for c in s.crossings])
        sites = measured_sites(self.priors, bounds, _merged_steps(seen), hosts)
        cadence = {s.name: 1 for s in self.priors} | {r: k for s in seen for r, k in s.cadence.items()}
        plan = PlanSettings(shards=len(routes), relays=self.relays, cadence=cadence)
        site_of = [self.sites_of_shards[newest.owner(p)] for p in range(newest.fragments)]
        decision = self.planner.consider(now, sites, self.traffic, site_of, plan)
        event: dict[str, Any] = {
            "t": now,
            "epoch": newest.epoch,
            "finished": finished,
            "sites": {s.name: _site_view(s, bounds) for s in sites},
            "utilisation": _rounded(self.planner.current),
            "best": _rounded(self.planner.best),
            "streak": self.planner.streak,
            "floor": self.planner.settings.min_utilisation,
            "replan": None,
        }
        if decision is not None:
            event["replan"] = self._carry_out(decision, newest)
        return event

    def _maps(self) -> tuple[dict[str, str], dict[str, shardmap.ShardMap]]:
        """Shard name -> URL, and each shard's own map (checked like a learner checks it)."""
        from ddctl_agents.agent.client import retry
        from ddctl_agents.agent.routes import discover

        clients = {url: self.connect(url) for url in self.urls}
        try:
            answers = {url: retry(clients[url].shards, give_up_after_s=30.0) for url in self.urls}
        finally:
            for client in clients.values():
                client.close()
        routes = discover(self.urls, answers.__getitem__)
        if routes.map is None:
            raise DdctlError(f"{self.urls[0]} is not sharded: there is nothing to re-plan")
        own = {str(a["shard"]): shardmap.parse(a["map"]) for a in answers.values() if a is not None}
        return {s: routes.url_of_shard(s) for s in routes.map.shards}, own

    def _finish_handoffs(self, newest: shardmap.ShardMap, own: dict[str, shardmap.ShardMap]) -> list[int]:
        """Fragments a broken handoff left between two shards (the new owner never took them in): finished now."""
        stranded = [p for p in range(newest.fragments) if own[newest.owner(p)].owner(p) != newest.owner(p)]
        for p in stranded:
            move(self.urls, self.connect, p, newest.owner(p))
        return stranded

    def _carry_out(self, decision: Replan, newest: shardmap.ShardMap) -> dict[str, Any]:
        """The moves, one handoff each; one that fails ends the re-plan there (reported with it): a hand-out that was
        made is finished by a later look, and the rest wait for the next decision."""
        owned = {s: len(newest.owned(s)) for s in newest.shards}
        moves: list[dict[str, Any]] = []
        for m in decision.moves:
            to = min((s for s, site in self.sites_of_shards.items() if site == m.target), key=lambda s: (owned[s], s))
            made: dict[str, Any] = {"fragment": m.fragment, "from": m.source, "to": m.target, "shard": to}
            moves.append(made)
            try:
                made["seconds"] = move(self.urls, self.connect, m.fragment, to).get("seconds")
            except DdctlError as exc:
                made["error"] = str(exc)[:300]
                break
            owned[to] += 1
        return {"cause": decision.cause, "before": _rounded(decision.before), "after": _rounded(decision.after), "moves": moves}


def watch(replanning: Replanning, every_s: float, until: Callable[[], bool], on_event: Callable[[dict[str, Any]], None]) -> int:
    """Tick every ``every_s`` seconds until ``until()``; a tick that fails is reported and the next one tries again.
    Returns the re-plans made."""
    made = 0
    while not until():
        started = time.monotonic()
        try:
            event = replanning.tick()
        except Exception as exc:  # noqa: BLE001 (one bad answer or a shard down must not stop the loop)
            event = {"t": replanning.clock(), "error": f"{type(exc).__name__}: {exc}"[:500]}
        made += event.get("replan") is not None
        on_event(event)
        time.sleep(max(0.0, every_s - (time.monotonic() - started)))
    return made


def _ending(status: Any) -> bool:
    job = status.get("job") if isinstance(status, dict) else None
    return isinstance(job, dict) and job.get("phase") in ("finishing", "finished")


def _merged_steps(seen: Sequence[Seen]) -> dict[str, list[float]]:
    """Every shard hears every learner's pace: one shard's figures per region (the first that has any) are enough."""
    out: dict[str, list[float]] = {}
    for s in seen:
        for region, steps in s.steps.items():
            out.setdefault(region, list(steps))
    return out


def _site_view(site: Site, bounds: Bounds) -> dict[str, Any]:
    """A site as the re-planner saw it: its link each way (measured, or the prior) and its learners' step."""
    return {
        "up_mbps": round(site.up_bytes_s * 8 / 1e6, 3),
        "down_mbps": round(site.down_bytes_s * 8 / 1e6, 3),
        "measured": [site.name in bounds[0], site.name in bounds[1]],
        "step_s": round(site.step_s, 4),
    }


def _rounded(value: float) -> float | None:
    return None if not math.isfinite(value) else round(value, 4)


def for_job(
    rf: RegionsFile, job: JobConfig, urls: list[str], connect: Callable[[str], SyncerClient], sites_of_shards: dict[str, str]
) -> Replanning:
    """The re-planner of the job ``job`` laid out by ``rf``: its priors, traffic, relays and re-plan settings."""
    from ddctl.config import synchronizer

    section = rf.synchronizer
    knobs = section.replan if section is not None else None
    settings = ReplanSettings(**knobs.model_dump()) if knobs is not None else ReplanSettings()
    return Replanning(
        urls=urls,
        connect=connect,
        sites_of_shards=sites_of_shards,
        priors=synchronizer.sites(rf, job, synchronizer.parameters(job)),
        traffic=synchronizer.traffic(job),
        relays=synchronizer.settings(rf).relays,
        planner=Replanner(settings),
    )


def parse_sites(pairs: Sequence[str]) -> dict[str, str]:
    """``S0=a`` pairs -> {shard: region}, each checked."""
    out: dict[str, str] = {}
    for pair in pairs:
        shard, _, region = pair.partition("=")
        if not shardmap.SHARD_NAME.match(shard) or not region:
            raise DdctlError(f"--site takes SHARD=REGION (S0=us-east-1, ...), got {pair!r:.60}")
        if shard in out:
            raise DdctlError(f"--site names shard {shard} twice")
        out[shard] = region
    return out
