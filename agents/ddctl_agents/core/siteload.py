"""The link load a synchronizer layout puts on every site, and the least worst-site load possible (pure).

A *site* is a region's link to the backbone: its learners share it, and a shard
placed there is reached through it. Per outer period a learner sends each
fragment once (int4, ~0.53 bytes per parameter) and pulls its new version once
(bf16, 2 bytes per parameter); a region that sends every ``k`` periods
(*cadence*) moves ``1/k`` of that, and a region with a *relay* pulls each
version into the region once, not once per learner. Traffic between a learner
and a shard in the same region never crosses the site link.

With a share ``x`` of the model's bytes owned by shards at site ``s``:

    egress(s)  = (1 - x) * U_s + x * (sum of D_r over the other sites)
    ingress(s) = (1 - x) * D_s + x * (sum of U_r over the other sites)

where ``U_r``/``D_r`` are the bytes per second site ``r``'s learners would send
to / pull from shards elsewhere if every shard were elsewhere. Each site's
utilisation (the larger of egress over its uplink and ingress over its
downlink) depends on its own share alone and is convex in it, so the least
worst-site utilisation over all splits of the model is found exactly by
bisection on the target: at a target, each site admits an interval of shares,
and the target is reachable when the intervals can sum to one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

BISECTIONS = 60
"""Halvings of the bisection: 2^-60 of the starting interval, far below any link's noise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Site:
    """One region as the scheduler sees it: its learners and the link they share."""

    name: str
    learners: int
    up_bytes_s: float
    """What the site's link carries out of the region, bytes per second."""
    down_bytes_s: float
    step_s: float
    """One learner's inner step there, seconds (a period is H of them)."""
    candidate: bool = True
    """It may host shards."""
    round_trip_s: float = 0.0
    """From a learner's send of a fragment to its adoption of the next version (measured; 0 before any measurement).

    A learner schedules a fragment's next send k·H − 1 steps after it adopts a version, so a wait of r seconds
    stretches its period from k·H steps to k·H steps plus r less one step: it moves that much less a second."""

    def __post_init__(self) -> None:
        if self.learners < 0 or not all(math.isfinite(v) and v > 0 for v in (self.up_bytes_s, self.down_bytes_s, self.step_s)):
            raise ValueError(f"site {self.name!r}: learners must be >= 0 and link rates and step time finite and > 0")
        if not (math.isfinite(self.round_trip_s) and self.round_trip_s >= 0):
            raise ValueError(f"site {self.name!r}: round_trip_s must be finite and >= 0, got {self.round_trip_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """Bytes per second one site's learners move to and from shards, were every shard elsewhere."""

    up: float
    down: float


def demand(site: Site, up_bytes: float, down_bytes: float, inner_steps: int, cadence: int, relay: bool) -> Demand:
    """``up_bytes``/``down_bytes``: one learner's upload and download of the whole model in one period."""
    period = cadence * inner_steps * site.step_s + max(site.round_trip_s - site.step_s, 0.0)
    pulls = 1 if relay and site.learners else site.learners
    return Demand(up=site.learners * up_bytes / period, down=pulls * down_bytes / period)


@dataclass(frozen=True, slots=True, kw_only=True)
class SiteLoad:
    """What a layout puts on one site's link: bytes per second each way, and the busier direction's share of it."""

    site: str
    egress: float
    ingress: float
    utilisation: float


def site_load(site: Site, own: Demand, others_up: float, others_down: float, share_up: float, share_down: float) -> SiteLoad:
    """The load on ``site`` when its shards own ``share_up`` of the upload bytes and ``share_down`` of the versions.

    ``others_up``/``others_down``: the other sites' demands summed."""
    egress = (1 - share_up) * own.up + share_down * others_down
    ingress = (1 - share_down) * own.down + share_up * others_up
    return SiteLoad(
        site=site.name,
        egress=egress,
        ingress=ingress,
        utilisation=max(egress / site.up_bytes_s, ingress / site.down_bytes_s),
    )


def loads(
    sites: Sequence[Site], demands: Sequence[Demand], shares: Sequence[float], down_shares: Sequence[float] | None = None
) -> list[SiteLoad]:
    """Every site's load when site i owns ``shares[i]`` of the upload bytes and ``down_shares[i]`` (default: the
    same) of the version bytes."""
    total_up, total_down = sum(d.up for d in demands), sum(d.down for d in demands)
    downs = shares if down_shares is None else down_shares
    return [
        site_load(s, d, total_up - d.up, total_down - d.down, x_up, x_down)
        for s, d, x_up, x_down in zip(sites, demands, shares, downs, strict=True)
    ]


def _lines(site: Site, own: Demand, others_up: float, others_down: float) -> tuple[tuple[float, float], ...]:
    """Utilisation = max over these (a, b) of a + b * share: egress, then ingress."""
    return (
        (own.up / site.up_bytes_s, (others_down - own.up) / site.up_bytes_s),
        (own.down / site.down_bytes_s, (others_up - own.down) / site.down_bytes_s),
    )


def _interval(lines: tuple[tuple[float, float], ...], target: float, hosts: bool) -> tuple[float, float] | None:
    """The shares at which a site stays within ``target``; None if none does (a non-host must take 0)."""
    lo, hi = 0.0, 1.0 if hosts else 0.0
    for a, b in lines:
        if b > 0:
            hi = min(hi, (target - a) / b)
        elif b < 0:
            lo = max(lo, (target - a) / b)
        elif a > target:
            return None
    return (lo, hi) if lo <= hi else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """The least worst-site utilisation over all ways of sharing the model among the hosts, and one share vector."""

    utilisation: float
    shares: tuple[float, ...]
    loads: tuple[float, ...]
    """Each site's utilisation at those shares."""


Lines = tuple[tuple[float, float], ...]


def best_split(sites: Sequence[Site], demands: Sequence[Demand], hosts: Sequence[bool]) -> Split:
    """Exact min-max over fractional shares (bisection on the target; see the module docstring), lexicographic.

    The worst site is often one whose own learners load it (a slow region's link): no share
    lowers it, and the min-max alone would leave the rest anywhere below it. So a site pinned at
    the target keeps its share of a split that reaches the target (any other share could leave the
    rest unable to), and the others are balanced again among themselves, until the
    sites left are balanced. ``hosts[i]``: site i may own a share; at least one must."""
    if not any(hosts):
        raise ValueError("at least one site must host a shard")
    total_up, total_down = sum(d.up for d in demands), sum(d.down for d in demands)
    lines = [_lines(s, d, total_up - d.up, total_down - d.down) for s, d in zip(sites, demands, strict=True)]
    fixed: dict[int, float] = {}
    worst: float | None = None
    while True:
        active = [i for i in range(len(sites)) if i not in fixed]
        target, intervals = _bisect([lines[i] for i in active], [hosts[i] for i in active], 1 - sum(fixed.values()))
        worst = target if worst is None else worst
        pinned = [j for j, i in enumerate(active) if _least(lines[i], hosts[i]) >= target - 1e-9]
        free_hosts = [j for j, i in enumerate(active) if hosts[i] and j not in pinned]
        if not pinned or not free_hosts:
            shares = dict(fixed) | dict(zip(active, _fill(intervals, 1 - sum(fixed.values())), strict=True))
            vector = tuple(shares[i] for i in range(len(sites)))
            return Split(utilisation=worst, shares=vector, loads=tuple(x.utilisation for x in loads(sites, demands, vector)))
        feasible = _fill(intervals, 1 - sum(fixed.values()))  # the others can still reach the target around it
        for j in pinned:
            fixed[active[j]] = feasible[j]


def _bisect(lines: Sequence[Lines], hosts: Sequence[bool], mass: float) -> tuple[float, list[tuple[float, float]]]:
    """The least target at which shares within each site's interval can sum to ``mass``, and those intervals."""

    def intervals(target: float) -> list[tuple[float, float]] | None:
        found = []
        for line, host in zip(lines, hosts, strict=True):
            interval = _interval(line, target, host)
            if interval is None:
                return None
            found.append(interval)
        return found if sum(lo for lo, _ in found) <= mass + 1e-12 and sum(hi for _, hi in found) >= mass - 1e-12 else None

    # any share in [0, 1] of a host stays within its endpoints' worse value (convexity): that target is reachable
    low, high = (
        0.0,
        max(
            max(a + b * x for a, b in line for x in (0.0, 1.0 if host else 0.0)) for line, host in zip(lines, hosts, strict=True)
        ),
    )
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        if intervals(middle) is None:
            low = middle
        else:
            high = middle
    chosen = intervals(high)
    assert chosen is not None, "the upper end of the bisection is always reachable"
    return high, chosen


def _least(line: Lines, host: bool) -> float:
    """A site's least utilisation over the shares it may take: [0, 1] for a host, 0 otherwise (convex: an end or
    where the two lines cross)."""
    points = [0.0, 1.0] if host else [0.0]
    (a1, b1), (a2, b2) = line
    if host and b1 != b2 and 0 < (cross := (a2 - a1) / (b1 - b2)) < 1:
        points.append(cross)
    return min(max(a + b * x for a, b in line) for x in points)


def _fill(intervals: list[tuple[float, float]], mass: float) -> tuple[float, ...]:
    """Shares within each interval that sum to ``mass``: every lower end, the rest spread in proportion to the room."""
    shares = [lo for lo, _ in intervals]
    room = [hi - lo for lo, hi in intervals]
    rest, total_room = mass - sum(shares), sum(room)
    if total_room > 0:
        shares = [x + rest * r / total_room for x, r in zip(shares, room, strict=True)]
    return tuple(max(0.0, x) for x in shares)
