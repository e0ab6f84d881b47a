"""The shard plan: each region's send cadence and relay, where shards run, and which fragments each owns (pure).

Four decisions, from the link of every site (``siteload.Site``: declared links
as priors, replaced by measurements) and the bytes each fragment moves:

1. **Cadence**: a region sends every ``k`` periods, the smallest ``k`` in
   ``CADENCES`` at which its own traffic fits ``target`` of its link. That floor
   is the region's own, whatever the placement: no shard moves it.
2. **Relays**: a region with several learners at cadence 1 pulls each version
   in once. A relay forwards every version, and a learner at cadence k > 1 is
   sent only the 1/k it adopts, so past cadence 1 a relay would not save bytes
   and the region has none (its cadence is chosen without one).
3. **Placement**: shards go to the candidate sites of the exact min-max split
   (``siteload.best_split``); with a fixed number of shards, the best set of
   that many sites (every subset when there are few, else greedily).
4. **Assignment**: whole fragments, in due order (the staggered schedule), each
   to the site furthest below its share, then single moves that lower the worst
   site until none does; within a site, shards take its fragments in turn.

The plan reports its busiest shard site against the bound (the same site set's
fractional split), as fragmentation reports its imbalance. Everything is deterministic:
ties break by site order, then fragment index.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from ddctl_agents.core.schedule import CADENCES
from ddctl_agents.core.siteload import Demand, Site, SiteLoad, best_split, demand, loads

TARGET_UTILISATION = 0.8
"""A link loaded past this queues: a period's sends would not finish in the period with room for bursts."""
MAX_SUBSETS = 256
"""Placements of a fixed shard count tried exhaustively up to this many site subsets; greedily past it."""
IMPROVEMENT_PASSES = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Traffic:
    """What one outer period moves for one learner, per fragment: its upload and its version pull (bytes)."""

    up: tuple[int, ...]
    down: tuple[int, ...]
    inner_steps: int

    def __post_init__(self) -> None:
        if len(self.up) != len(self.down) or not self.up or min(*self.up, *self.down) <= 0 or self.inner_steps < 1:
            raise ValueError("traffic needs one positive upload and one positive pull size per fragment, and H >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSettings:
    shards: int | None = None
    """A fixed number of shards; None: one per site the best split uses."""
    relays: bool = True
    cadence: dict[str, int] | None = None
    """Cadences the user fixed, by site; the rest are chosen."""
    target: float = TARGET_UTILISATION


@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    index: int
    site: str
    fragments: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardPlan:
    cadence: dict[str, int]
    relay: dict[str, bool]
    shards: tuple[Shard, ...]
    owner: tuple[int, ...]
    """Fragment -> the shard that owns it."""
    loads: tuple[SiteLoad, ...]
    bound: float
    """The least worst-site utilisation any split of the model among the chosen sites could reach."""
    host_bound: float
    """The same split's busiest shard site: what whole fragments are measured against."""
    floor: dict[str, float]
    """Each site's utilisation from its own learners alone (all shards elsewhere): no placement goes below it."""

    @property
    def utilisation(self) -> float:
        return max(load.utilisation for load in self.loads)

    @property
    def over_bound(self) -> float:
        """The busiest shard site against the bound (>= 1): what whole fragments cost against a fractional split."""
        hosting = {s.site for s in self.shards}
        busiest = max(x.utilisation for x in self.loads if x.site in hosting)
        return busiest / self.host_bound if self.host_bound > 0 else 1.0

    def site_of(self, fragment: int) -> str:
        return self.shards[self.owner[fragment]].site


def choose_cadence(site: Site, traffic: Traffic, relay: bool, target: float) -> int:
    """The smallest cadence at which the site's own traffic fits ``target`` of its link (the largest if none does).

    ``relay``: the site may have one, which it runs at cadence 1 only."""
    for k in CADENCES:
        own = demand(site, sum(traffic.up), sum(traffic.down), traffic.inner_steps, k, relay and k == 1)
        if max(own.up / site.up_bytes_s, own.down / site.down_bytes_s) <= target:
            return k
    return CADENCES[-1]


def plan_shards(sites: Sequence[Site], traffic: Traffic, settings: PlanSettings = PlanSettings()) -> ShardPlan:
    """The plan for ``sites`` (see the module docstring)."""
    if not any(s.candidate for s in sites):
        raise ValueError("no site may host a shard: mark at least one as a candidate")
    if settings.shards is not None and not 1 <= settings.shards <= len(traffic.up):
        raise ValueError(f"shards must be 1..{len(traffic.up)} (one fragment each at least), got {settings.shards}")
    fixed = settings.cadence or {}
    may_relay = {s.name: settings.relays and s.learners > 1 for s in sites}
    cadence = {s.name: fixed.get(s.name) or choose_cadence(s, traffic, may_relay[s.name], settings.target) for s in sites}
    relay = {name: may and cadence[name] == 1 for name, may in may_relay.items()}
    demands = _demands(sites, traffic, cadence, relay)
    hosts = _hosting_sites(sites, demands, settings.shards)
    split = best_split(sites, demands, hosts)
    site_owner = _assign(sites, demands, traffic, split.shares, hosts)
    per_site = _shard_counts(site_owner, len(sites), split.shares, settings.shards)
    shards, owner = _number_shards(sites, site_owner, per_site)
    fractions = _fractions(len(sites), site_owner, traffic)
    floor = {s.name: max(d.up / s.up_bytes_s, d.down / s.down_bytes_s) for s, d in zip(sites, demands, strict=True)}
    return ShardPlan(
        cadence=cadence,
        relay=relay,
        shards=shards,
        owner=owner,
        loads=tuple(_realised(sites, demands, fractions)),
        bound=split.utilisation,
        host_bound=max(u for u, h in zip(split.loads, hosts, strict=True) if h),
        floor=floor,
    )


def _hosting_sites(sites: Sequence[Site], demands: Sequence[Demand], shards: int | None) -> list[bool]:
    """Which sites host shards: the best split's for auto; for a fixed count, the best set of up to that many."""
    candidates = [i for i, s in enumerate(sites) if s.candidate]
    if shards is None:
        split = best_split(sites, demands, [s.candidate for s in sites])
        used = [i for i in candidates if split.shares[i] > 1e-9]
        return [i in used for i in range(len(sites))]
    size = min(shards, len(candidates))

    def worst(chosen: Sequence[int]) -> tuple[float, ...]:
        """Site loads worst first: a worst site pinned by its own learners leaves the choice to the next ones."""
        split = best_split(sites, demands, [i in chosen for i in range(len(sites))])
        return tuple(sorted((round(u, 9) for u in split.loads), reverse=True))

    subsets = list(itertools.islice(itertools.combinations(candidates, size), MAX_SUBSETS + 1))
    if len(subsets) <= MAX_SUBSETS:
        best = min(subsets, key=worst)
    else:  # greedily: add the site that lowers the worst site most
        best = ()
        for _ in range(size):
            best = min(((*best, i) for i in candidates if i not in best), key=worst)
    return [i in best for i in range(len(sites))]


def _assign(
    sites: Sequence[Site], demands: Sequence[Demand], traffic: Traffic, shares: Sequence[float], hosts: Sequence[bool]
) -> list[int]:
    """Fragment -> site index: in due order to the site furthest below its share, then improving single moves."""
    total = sum(traffic.up)
    taken = [0.0] * len(sites)
    owner: list[int] = []
    for size in traffic.up:
        site = max((i for i, h in enumerate(hosts) if h), key=lambda i: (shares[i] * total - taken[i], -i))
        owner.append(site)
        taken[site] += size

    up, down = [0.0] * len(sites), [0.0] * len(sites)
    for fragment, site in enumerate(owner):
        up[site] += traffic.up[fragment]
        down[site] += traffic.down[fragment]
    total_down = sum(traffic.down)

    def worst() -> tuple[float, ...]:
        """The sites' utilisations, worst first, compared in that order (a pinned worst site leaves the next)."""
        fractions = [(u / total, d / total_down) for u, d in zip(up, down, strict=True)]
        return tuple(sorted((round(x.utilisation, 9) for x in _realised(sites, demands, fractions)), reverse=True))

    current = worst()
    for _ in range(IMPROVEMENT_PASSES):
        improved = False
        for fragment, site in itertools.product(range(len(owner)), range(len(sites))):
            was = owner[fragment]
            if not hosts[site] or was == site:
                continue
            moved = (traffic.up[fragment], traffic.down[fragment])
            up[was], down[was], up[site], down[site] = (
                up[was] - moved[0],
                down[was] - moved[1],
                up[site] + moved[0],
                down[site] + moved[1],
            )
            if (value := worst()) < current:
                owner[fragment], current, improved = site, value, True
            else:
                up[was], down[was], up[site], down[site] = (
                    up[was] + moved[0],
                    down[was] + moved[1],
                    up[site] - moved[0],
                    down[site] - moved[1],
                )
        if not improved:
            break
    return owner


def _fractions(count: int, owner: Sequence[int], traffic: Traffic) -> list[tuple[float, float]]:
    """Each site's share of the upload bytes and of the version bytes, under ``owner``."""
    up, down = [0.0] * count, [0.0] * count
    for fragment, site in enumerate(owner):
        up[site] += traffic.up[fragment]
        down[site] += traffic.down[fragment]
    total_up, total_down = sum(traffic.up), sum(traffic.down)
    return [(u / total_up, d / total_down) for u, d in zip(up, down, strict=True)]


def _realised(sites: Sequence[Site], demands: Sequence[Demand], fractions: Sequence[tuple[float, float]]) -> list[SiteLoad]:
    return loads(sites, demands, [up for up, _ in fractions], [down for _, down in fractions])


def _shard_counts(site_owner: Sequence[int], count: int, shares: Sequence[float], shards: int | None) -> list[int]:
    """Shards per site: one per site that owns fragments, and any more a fixed count asks for to the largest
    shares per shard in turn (a shard owns one fragment at least)."""
    owned = [sum(1 for o in site_owner if o == i) for i in range(count)]
    counts = [int(n > 0) for n in owned]
    for _ in range(max(0, (shards or 0) - sum(counts))):
        room = [i for i in range(count) if counts[i] and counts[i] < owned[i]]
        if not room:
            break
        site = max(room, key=lambda i: (shares[i] / counts[i], -i))
        counts[site] += 1
    return counts


def _number_shards(
    sites: Sequence[Site], site_owner: Sequence[int], per_site: Sequence[int]
) -> tuple[tuple[Shard, ...], tuple[int, ...]]:
    """Shards numbered in site order; a site's fragments dealt to its shards in turn, in due order."""
    first = [0, *itertools.accumulate(per_site)][:-1]
    dealt = [0] * len(sites)
    owner: list[int] = []
    for site in site_owner:
        owner.append(first[site] + dealt[site] % per_site[site])
        dealt[site] += 1
    shards = tuple(
        Shard(index=first[i] + j, site=s.name, fragments=tuple(f for f, o in enumerate(owner) if o == first[i] + j))
        for i, s in enumerate(sites)
        for j in range(per_site[i])
    )
    return shards, tuple(owner)


def placement_loads(
    sites: Sequence[Site], traffic: Traffic, cadence: dict[str, int], relay: dict[str, bool], site_of: Sequence[str]
) -> list[SiteLoad]:
    """Every site's load when fragment f is owned at site ``site_of[f]``, at the given cadences and relays."""
    index = {s.name: i for i, s in enumerate(sites)}
    demands = _demands(sites, traffic, cadence, relay)
    return _realised(sites, demands, _fractions(len(sites), [index[x] for x in site_of], traffic))


def _demands(sites: Sequence[Site], traffic: Traffic, cadence: dict[str, int], relay: dict[str, bool]) -> list[Demand]:
    """Every site's own learners' traffic at its cadence and relay setting."""
    return [demand(s, sum(traffic.up), sum(traffic.down), traffic.inner_steps, cadence[s.name], relay[s.name]) for s in sites]


def placement_utilisation(found: Sequence[SiteLoad], floor: dict[str, float]) -> float:
    """The worst site the placement can change (``placement_dependent``)."""
    return max(placement_dependent(found, floor), default=0.0)


def placement_dependent(found: Sequence[SiteLoad], floor: dict[str, float]) -> list[float]:
    """The utilisations of the sites whose load the placement sets: a site hosting no fragment carries exactly its
    own learners' traffic (its floor), whatever the placement; a host carries more (it serves other regions) or less
    (its own learners' traffic stays inside), never the floor but by coincidence."""
    return [x.utilisation for x in found if abs(x.utilisation - floor[x.site]) > 1e-9 * max(floor[x.site], 1e-12)]
