"""regions.yaml's ``synchronizer:`` section, and the shard plan the scheduler makes of the file before any measurement.

``syncer: REGION`` (the old key) still means one synchronizer in REGION. The
section names the regions that may host shards, how many shards (a number, or
``auto``: as many as the link-load split uses), relays and the re-plan settings.
The scheduler (``core/shardplan.py``) needs each region's link and step time;
before a run has measured them they are priors: a local region's emulated
``link:``, else ``DEFAULT_LINK_MBPS``; a step from the model's FLOPs on the
region's accelerators at ``MFU_PRIOR`` (``CPU_FLOPS_PRIOR`` without one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ddctl.errors import RegionsError
from ddctl_agents.core.schedule import CADENCES
from ddctl_agents.core.shardplan import PlanSettings, ShardPlan, Traffic, plan_shards
from ddctl_agents.core.siteload import Site
from ddctl_agents.train import flops, presets
from ddctl_agents.train.job import JobConfig

if TYPE_CHECKING:
    from ddctl.config.regions import Region, RegionsFile

DEFAULT_LINK_MBPS = 1000.0
"""A region without a declared link: a cross-region path a VM commonly gets, until the run measures it."""
MFU_PRIOR = 0.4
CPU_FLOPS_PRIOR = 3e10
"""Model FLOPs per second a CPU learner reaches (the tiny preset's step on this project's 2-core CI machine)."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)  # .inf is no rate or time


class Replan(Strict):
    """When the running synchronizer moves fragments between shards (``core/replan.py``)."""

    gain: Annotated[float, Field(gt=0, lt=1, description="predicted improvement, a number in (0, 1)")] = 0.2
    confirmations: Annotated[int, Field(ge=1, le=100, description="times in a row, an integer 1..100")] = 3
    dwell_s: Annotated[float, Field(ge=0, description="seconds between moves, a number >= 0")] = 300.0
    max_moves: Annotated[int, Field(ge=1, le=1024, description="fragments moved at once, an integer 1..1024")] = 4
    min_utilisation: Annotated[
        float, Field(ge=0, lt=1, description="the busiest site's share of its link below which nothing moves, in [0, 1)")
    ] = 0.5


class SynchronizerSection(Strict):
    shards: Annotated[
        Annotated[int, Field(ge=1, le=4096)] | Literal["auto"], Field(description="auto, or a number of shards 1..fragments")
    ] = 1
    regions: Annotated[tuple[str, ...], Field(description="the regions that may host shards (default: all)")] = ()
    relays: Annotated[bool, Field(description="true or false: a region with several learners pulls versions once")] = True
    replan: Annotated[Replan, Field(description="{gain, confirmations, dwell_s, max_moves, min_utilisation}")] = Replan()


def check_section(rf: RegionsFile) -> None:
    """``syncer`` or ``synchronizer`` (one of them), real region names, valid cadences."""
    names = [r.name for r in rf.regions]
    if rf.syncer and rf.synchronizer is not None:
        raise RegionsError(
            f"{rf.path}: syncer: give syncer: REGION (one synchronizer) or a synchronizer: section, not both",
            path=rf.path,
            key="syncer",
        )
    if not rf.syncer and rf.synchronizer is None:
        raise RegionsError(
            f"{rf.path}: syncer: required (the region of the one synchronizer), or a synchronizer: section; "
            f"allowed: {', '.join(names)}",
            path=rf.path,
            key="syncer",
        )
    if rf.synchronizer is not None:
        for name in rf.synchronizer.regions:
            if name not in names:
                raise RegionsError(
                    f"{rf.path}: synchronizer.regions: {name!r} is not a region here; allowed: {', '.join(names)}",
                    path=rf.path,
                    key="synchronizer.regions",
                )
    for i, region in enumerate(rf.regions):
        if region.cadence != "auto" and region.cadence not in CADENCES:
            raise RegionsError(
                f"{rf.path}: regions[{i}].cadence: {region.cadence!r} is not a cadence; allowed: auto, "
                f"{', '.join(map(str, CADENCES))}",
                path=rf.path,
                key=f"regions[{i}].cadence",
            )


def link_mbps(region: Region) -> tuple[float, float, bool]:
    """(up, down, declared): the region's emulated link, else the default prior."""
    if region.link is not None:
        return region.link.up_mbps, region.link.down_mbps, True
    return DEFAULT_LINK_MBPS, DEFAULT_LINK_MBPS, False


def step_prior(region: Region, job: JobConfig, params: int) -> float:
    """Seconds one inner step of a learner in ``region`` takes, from FLOPs (a prior until measured)."""
    model = presets.model_config(job.inner)
    per_token = flops.custom_flops_per_token(params) if job.inner.model else flops.flops_per_token(model)
    peak = flops.peak_flops(region.accelerator) if region.accelerator else None
    rate = CPU_FLOPS_PRIOR if peak is None else peak * MFU_PRIOR * region.world
    return job.inner.batch_size * model.seq_len * per_token / rate


def traffic(job: JobConfig) -> Traffic:
    """One learner's bytes per period, fragment by fragment: the job's frames (``control/quotes.py``) in equal
    fragments (balanced LPT is within 1% of equal on the presets)."""
    from ddctl.control.quotes import sync_traffic

    whole, count = sync_traffic(job), job.sync.fragments
    return Traffic(
        up=tuple(_split(whole.up_bytes, count)),
        down=tuple(_split(whole.down_bytes, count)),
        inner_steps=job.sync.inner_steps,
    )


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if p < total % parts else 0) for p in range(parts)]


def parameters(job: JobConfig) -> int:
    from ddctl.control.quotes import tensor_sizes

    return sum(tensor_sizes(job))


def sites(rf: RegionsFile, job: JobConfig, params: int) -> list[Site]:
    section = rf.synchronizer
    candidates = {rf.syncer} if section is None else set(section.regions) or None  # None: every region
    out = []
    for region in rf.regions:
        up, down, _ = link_mbps(region)
        out.append(
            Site(
                name=region.name,
                learners=region.learners,
                up_bytes_s=up * 1e6 / 8,
                down_bytes_s=down * 1e6 / 8,
                step_s=step_prior(region, job, params),
                candidate=candidates is None or region.name in candidates,
            )
        )
    return out


def settings(rf: RegionsFile) -> PlanSettings:
    section = rf.synchronizer
    shards = 1 if section is None else None if section.shards == "auto" else section.shards
    fixed = {r.name: r.cadence for r in rf.regions if isinstance(r.cadence, int)}
    relays = section.relays if section is not None else True
    return PlanSettings(shards=shards, relays=relays, cadence=fixed or None)


def shard_plan(rf: RegionsFile, job: JobConfig, found: list[Site] | None = None) -> ShardPlan:
    """The scheduler's plan for this file, from the priors (refused with the key when it cannot be made)."""
    try:
        return plan_shards(found or sites(rf, job, parameters(job)), traffic(job), settings(rf))
    except ValueError as exc:
        raise RegionsError(f"{rf.path}: synchronizer: {exc}", path=rf.path, key="synchronizer") from None


def summary(rf: RegionsFile, job: JobConfig) -> dict[str, Any]:
    """The plan as ``up --plan`` shows it: shards, each region's cadence and relay, link loads against the bound."""
    found = sites(rf, job, parameters(job))
    plan = shard_plan(rf, job, found)
    steps = {s.name: s.step_s for s in found}
    rows = []
    for region, load in zip(rf.regions, plan.loads, strict=True):
        up, down, declared = link_mbps(region)
        rows.append(
            {
                "region": region.name,
                "learners": region.learners,
                "link_mbps": [up, down],
                "link": "declared" if declared else "assumed",
                "step_s": round(steps[region.name], 4),
                "cadence": plan.cadence[region.name],
                "relay": plan.relay[region.name],
                "shards": [s.index for s in plan.shards if s.site == region.name],
                "egress_mbps": round(load.egress * 8 / 1e6, 3),
                "ingress_mbps": round(load.ingress * 8 / 1e6, 3),
                "utilisation": round(load.utilisation, 4),
                "floor": round(plan.floor[region.name], 4),
            }
        )
    return {
        "shards": [{"index": s.index, "region": s.site, "fragments": list(s.fragments)} for s in plan.shards],
        "sites": rows,
        "utilisation": round(plan.utilisation, 4),
        "bound": round(plan.bound, 4),
        "over_bound": round(plan.over_bound, 4),
    }


LOCAL_SHARDS = ("process", "docker")
"""The providers whose regions are on this machine: their shards run as processes (each on its own port) or Docker VMs
(each with an address of its own on every region's network: ``RegionInfo.shard_addresses``), which a cloud VM cannot
reach. A cloud's shards run on VMs of their own, each behind an address reserved for it (``RegionInfo.shard_hosts``)."""


def runnable_plan(rf: RegionsFile, job: JobConfig, kinds: dict[str, str]) -> ShardPlan:
    """The plan ``up`` runs: its shards (wherever it places them, but not on this machine when learners run on cloud
    VMs, which could not reach them), each region's learners at the plan's cadence (``--cadence``)."""
    plan = shard_plan(rf, job)
    clouds = sorted({kind for kind in kinds.values() if kind not in LOCAL_SHARDS})
    here = sorted({s.site for s in plan.shards if kinds[s.site] in LOCAL_SHARDS})
    if len(plan.shards) > 1 and clouds and here:
        raise RegionsError(
            f"{rf.path}: synchronizer.regions: the plan puts shards in {', '.join(here)} (up --plan shows them), regions on "
            f"this machine that {' and '.join(clouds)} VMs cannot reach; allowed: cloud regions only (name them in "
            "synchronizer.regions), or shards: 1",
            path=rf.path,
            key="synchronizer.regions",
        )
    return plan
