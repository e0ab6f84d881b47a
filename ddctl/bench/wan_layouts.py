"""``ddctl bench wan``'s case and the four layouts it compares, with what the link model predicts of each (pure).

The case is the issue's five regions, scaled down to this machine: site links in
the ratio 1000/1000/1000/200/50 and 2/2/2/1/1 learners, one job whose per-period
bytes come from its own frames (``config/synchronizer.traffic``). ``with_hubs`` adds
three synchronizer-only *hub* regions (no learners) on slower links: there the
synchronizers run at the hubs, and one synchronizer's site is the bottleneck, the
place the issue says sharding pays. The layouts:

- ``N``: one synchronizer at the first region (the first hub); every learner sends every
  period, three uploads in flight (today's transfers).
- ``N-rr``: three shards at the three fast regions (the hubs), fragments round robin;
  transfers as N.
- ``P2``: one synchronizer, with the plan's cadences and relays, paced.
- ``W``: the full scheduler: the plan's shards, sites, assignment, cadences and relays, paced.
- ``W-direct`` (on request only): the full scheduler planned without relays, which isolates what relays add.

A name may end ``@K``: every region sends every K periods instead of its planned cadence (``W@1``: the
plan's shards and relays with no region slowed down, which isolates what cadence costs in quality),
``+staleness`` or ``+period``: how its synchronizers weigh a late update (``SyncerConfig.late_weight``, staleness
by default; ``W+period``: W with the slowed regions' late drift weighed as one period whatever its age), and ``/N``
or ``/auto``: the uploads in flight, in that order (``W@1+period/auto``).

The plan gives a relay (``relay/``) to each region with several learners at
cadence 1; N and N-rr run none. The predictions are of what runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ddctl.config.synchronizer import CPU_FLOPS_PRIOR, traffic
from ddctl.errors import DdctlError
from ddctl_agents.core.choices import LATE_WEIGHTS
from ddctl_agents.core.config import OuterConfig, SyncerConfig
from ddctl_agents.core.pacing import parse_in_flight
from ddctl_agents.core.quorum import QuorumConfig
from ddctl_agents.core.schedule import CADENCES
from ddctl_agents.core.shardplan import PlanSettings, Traffic, placement_loads, plan_shards
from ddctl_agents.core.siteload import Site, SiteLoad
from ddctl_agents.train import flops, presets
from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget, SyncSettings
from ddctl_agents.train.job import JobConfig

LAYOUTS = ("N", "N-rr", "P2", "W")
"""The layouts a run compares unless told otherwise."""
KNOWN = (*LAYOUTS, "W-direct")
FIVE_REGIONS = (("a", 1.0, 2), ("b", 1.0, 2), ("c", 1.0, 2), ("d", 0.2, 1), ("e", 0.05, 1))
"""The issue's case: (region, its link as a share of the fast sites', learners), links in the ratio 1000/1000/1000/200/50."""
REGIONS = tuple(name for name, _, _ in FIVE_REGIONS)
HUB_NAMES = ("h1", "h2", "h3")
JOB_LATE_WEIGHT = SyncerConfig().late_weight
"""How the job weighs a late update where a layout's name does not say (``+period``, ``+staleness``)."""
BATCH = 8
"""Sequences in a learner's batch."""
PACED, UNPACED = None, 3
"""Uploads in flight: the learner's pacing (auto) for the paced layouts, a fixed three (its old default) otherwise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WanCase:
    """The regions, their links and learners, and the job they run."""

    fast_mbit: float = 10.0
    """The fast sites' link each way; the others follow ``regions``."""
    step_s: float = 0.1
    """One synthetic inner step."""
    seconds: float = 60.0
    """How long the learners train (the job's budget follows)."""
    preset: str = "micro"
    fragments: int = 6
    inner_steps: int = 8
    regions: tuple[tuple[str, float, int], ...] = FIVE_REGIONS
    """(name, link as a share of ``fast_mbit``, learners) per region; a region without learners may host shards."""
    train_tokens: int = 0
    """> 0: the learners train for real, this many tokens in all (``seconds`` and ``step_s`` then only bound the wait)."""
    max_behind: int = 1
    """Rounds an update's base may lag beyond its cadence and still be merged (late); 0 drops every late one."""

    def __post_init__(self) -> None:
        names = [name for name, _, _ in self.regions]
        if not 1 <= len(names) == len(set(names)) <= 16 or not all(isinstance(n, str) and n.isalnum() for n in names):
            raise DdctlError(f"regions need 1..16 distinct alphanumeric names, got {names}")
        if not all(0.001 <= share <= 1 and 0 <= learners <= 8 for _, share, learners in self.regions):
            raise DdctlError("each region's link share must be in [0.001, 1] and its learners in 0..8")
        if not sum(self.learners.values()):
            raise DdctlError("at least one region needs learners")
        if self.train_tokens and not 100_000 <= self.train_tokens <= 100_000_000:
            raise DdctlError(f"train_tokens must be 0 (synthetic steps) or in [100000, 100000000], got {self.train_tokens}")
        if not 0.1 <= self.fast_mbit <= 1000:
            raise DdctlError(f"fast_mbit must be in [0.1, 1000] Mbit/s, got {self.fast_mbit}")
        if not 0.01 <= self.step_s <= 60:
            raise DdctlError(f"step_s must be in [0.01, 60] seconds, got {self.step_s}")
        if not 10 * self.step_s * self.inner_steps <= self.seconds <= 3600:
            raise DdctlError(
                f"seconds must be in [{10 * self.step_s * self.inner_steps:g}, 3600] (10 periods at least), got {self.seconds}"
            )
        if not 1 <= self.inner_steps <= 1000:
            raise DdctlError(f"inner_steps must be in [1, 1000], got {self.inner_steps}")
        if not 0 <= self.max_behind <= 8:
            raise DdctlError(f"max_behind must be in 0..8 rounds, got {self.max_behind}")
        if not 3 <= self.fragments <= 64:
            raise DdctlError(f"fragments must be in [3, 64] (three shards own one each at least), got {self.fragments}")

    @property
    def links(self) -> dict[str, tuple[float, float]]:
        """Each region's (up, down) Mbit/s."""
        return {name: (self.fast_mbit * share,) * 2 for name, share, _ in self.regions}

    @property
    def learners(self) -> dict[str, int]:
        return {name: learners for name, _, learners in self.regions}

    @property
    def hosts(self) -> tuple[str, ...]:
        """Where the layouts may run synchronizers: the hubs (regions without learners) where there are any, else
        every region, in order."""
        hubs = tuple(name for name, _, learners in self.regions if not learners)
        return hubs or tuple(name for name, _, _ in self.regions)

    @property
    def learner_regions(self) -> dict[str, str]:
        """Each learner's name (L0, L1, ... region by region) and its region."""
        names = [region for region, count in self.learners.items() for _ in range(count)]
        return {f"L{i}": region for i, region in enumerate(names)}

    @property
    def seq_len(self) -> int:
        return presets.model_config(InnerConfig(preset=self.preset)).seq_len

    @property
    def steps(self) -> int:
        """Each learner's steps: the job's budget is every learner taking this many."""
        if self.train_tokens:
            return self.train_tokens // (BATCH * self.seq_len * sum(self.learners.values()))
        return int(self.seconds / self.step_s)

    @property
    def prior_step_s(self) -> float:
        """The step the plan assumes: the synthetic step; when training, the model's FLOPs at the CPU prior
        (``config/synchronizer.py``), slowed by the learners sharing this machine's cores. (The synthetic step
        planned a trained job as if each step took 0.1 s: eight times the traffic, every region at cadence 8.)"""
        if not self.train_tokens:
            return self.step_s
        model = presets.model_config(InnerConfig(preset=self.preset))
        one = BATCH * model.seq_len * flops.flops_per_token(model) / CPU_FLOPS_PRIOR
        return one * max(1.0, sum(self.learners.values()) / (os.cpu_count() or 1))

    def job(self) -> JobConfig:
        learners = sum(self.learners.values())
        return JobConfig(
            inner=InnerConfig(preset=self.preset, batch_size=BATCH),
            data=DataConfig() if self.train_tokens else DataConfig(max_bytes=1 << 21, eval_windows=8),
            budget=RunBudget(tokens=self.steps * BATCH * self.seq_len * learners, learners=learners),
            sync=SyncSettings(fragments=self.fragments, inner_steps=self.inner_steps),
            syncer=SyncerConfig(
                quorum=QuorumConfig(quorum=1), outer=OuterConfig(), inner_steps=self.inner_steps, max_behind=self.max_behind
            ),
        )

    def sites(self) -> list[Site]:
        return [
            Site(name=r, learners=n, up_bytes_s=up * 1e6 / 8, down_bytes_s=down * 1e6 / 8, step_s=self.prior_step_s)
            for (r, (up, down)), n in zip(self.links.items(), self.learners.values(), strict=True)
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    name: str
    shard_sites: tuple[str, ...]
    """Shard i runs at ``shard_sites[i]``."""
    owner: tuple[int, ...]
    """Fragment -> its shard."""
    cadence: dict[str, int]
    relay: dict[str, bool]
    """Regions whose learners pull versions through a relay of their own."""
    in_flight: int | None
    """Uploads in flight (the learner's ``--parallel-uploads``); None: auto."""
    loads: tuple[SiteLoad, ...]
    """What the link model predicts of every site under this layout."""
    late_weight: str = JOB_LATE_WEIGHT
    """How its synchronizers weigh an update behind its fragment's version (``SyncerConfig.late_weight``): the job's
    default unless the name says (``+period``)."""

    @property
    def predicted(self) -> float:
        """The busiest site's predicted utilisation."""
        return max(x.utilisation for x in self.loads)


def layouts(case: WanCase, names: Sequence[str] = LAYOUTS) -> list[Layout]:
    """The named layouts of ``case`` (see the module docstring); ``W/1`` is W with one upload in flight, ``W@1`` W with
    every region at cadence 1, ``W+period`` W whose synchronizers weigh a late update as one period whatever its age."""
    unknown = [n for n in names if n.partition("/")[0].partition("+")[0].partition("@")[0] not in KNOWN]
    if unknown or not names:
        raise DdctlError(f"layouts must be some of {', '.join(KNOWN)} (each may end @K, every region's cadence, "
                         f"+{'/+'.join(LATE_WEIGHTS)}, how late updates are weighed, and /auto or /N, uploads in flight), "
                         f"got {list(names)}")  # fmt: skip
    sites, flow = case.sites(), traffic(case.job())
    hosts = case.hosts
    home, spread = hosts[0], hosts[:3]
    every = dict.fromkeys(case.links, 1)
    one = tuple(0 for _ in range(case.fragments))
    rr = tuple(p % len(spread) for p in range(case.fragments))
    paced = plan_shards([_only(s, {home}) for s in sites], flow, PlanSettings(shards=1))
    free = [_only(s, set(hosts)) for s in sites]
    full, direct = plan_shards(free, flow, PlanSettings()), plan_shards(free, flow, PlanSettings(relays=False))
    none = dict.fromkeys(case.links, False)
    made = {
        "N": (((home,), one, every, none, UNPACED)),
        "N-rr": ((spread, rr, every, none, UNPACED)),
        "P2": (((home,), one, paced.cadence, paced.relay, PACED)),
        "W": ((tuple(s.site for s in full.shards), full.owner, full.cadence, full.relay, PACED)),
        "W-direct": ((tuple(s.site for s in direct.shards), direct.owner, direct.cadence, direct.relay, PACED)),
    }
    chosen = []
    for name in names:
        planned, slash, flight = name.partition("/")
        planned, plus, late_weight = planned.partition("+")
        if plus and late_weight not in LATE_WEIGHTS:
            raise DdctlError(f"layout {name}: +WEIGHT says how late updates are weighed, WEIGHT one of "
                             f"{', '.join(LATE_WEIGHTS)}, got {late_weight!r}")  # fmt: skip
        base, at, every_k = planned.partition("@")
        shard_sites, owner, cadence, relay, in_flight = made[base]
        in_flight = in_flight_setting(flight, f"layout {name}: uploads in flight") if slash else in_flight
        cadence = _every_region_at(every_k, cadence, relay, name) if at else cadence
        made_one = Layout(name=name, shard_sites=shard_sites, owner=owner, cadence=dict(cadence), relay=dict(relay),
                          in_flight=in_flight, loads=(), late_weight=late_weight or JOB_LATE_WEIGHT)  # fmt: skip
        chosen.append(replace(made_one, loads=predict(made_one, sites, flow)))
    return chosen


def layout_job(case: WanCase, layout: Layout) -> JobConfig:
    """The job ``layout``'s synchronizers run: ``case``'s, with the layout's weighing of late updates."""
    job = case.job()
    return replace(job, syncer=replace(job.syncer, late_weight=layout.late_weight))


def _every_region_at(text: str, cadence: dict[str, int], relay: dict[str, bool], name: str) -> dict[str, int]:
    """Every region at cadence ``text`` (one of CADENCES); above 1 refused where a region pulls through a relay, which
    serves every version (the learner refuses ``--relay`` with a cadence)."""
    if text not in {str(k) for k in CADENCES}:
        raise DdctlError(f"layout {name}: @K sets every region's cadence, K one of {', '.join(map(str, CADENCES))}, "
                         f"got {text!r}")  # fmt: skip
    relayed = sorted(region for region, on in relay.items() if on)
    if int(text) > 1 and relayed:
        raise DdctlError(f"layout {name}: regions {', '.join(relayed)} pull through a relay, which serves every "
                         f"version: their cadence must be 1 (a layout without relays takes it: W-direct@{text})")  # fmt: skip
    return dict.fromkeys(cadence, int(text))


def with_hubs(share: float) -> tuple[tuple[str, float, int], ...]:
    """The five regions and three synchronizer-only hubs whose links are ``share`` of the fast sites'."""
    if not 0.05 <= share <= 1.0:
        raise DdctlError(f"a hub's link must be a share in [0.05, 1] of the fast sites', got {share}")
    return FIVE_REGIONS + tuple((name, share, 0) for name in HUB_NAMES)


def in_flight_setting(text: str, option: str) -> int | None:
    """Uploads in flight as the learner's ``--parallel-uploads`` reads them (None: auto); a DdctlError naming
    ``option`` otherwise."""
    try:
        return parse_in_flight(text, option)
    except ValueError as exc:
        raise DdctlError(str(exc)) from None


def _only(site: Site, candidates: set[str]) -> Site:
    return Site(name=site.name, learners=site.learners, up_bytes_s=site.up_bytes_s, down_bytes_s=site.down_bytes_s,
                step_s=site.step_s, candidate=site.name in candidates)  # fmt: skip


def predict(layout: Layout, sites: Sequence[Site], flow: Traffic) -> tuple[SiteLoad, ...]:
    """The link model's load on every site under ``layout``."""
    return tuple(placement_loads(sites, flow, layout.cadence, layout.relay, [layout.shard_sites[o] for o in layout.owner]))


def at_pace(sites: Sequence[Site], step_s: dict[str, float], round_trip_s: dict[str, float] | None = None) -> list[Site]:
    """``sites`` with the step times and send-to-adoption waits the learners measured (where they did): the
    prediction of what ran."""
    waits = round_trip_s or {}
    return [replace(s, step_s=step_s.get(s.name, s.step_s), round_trip_s=waits.get(s.name, s.round_trip_s)) for s in sites]


__all__ = ["LAYOUTS", "Layout", "WanCase", "at_pace", "layout_job", "layouts", "predict", "with_hubs"]
