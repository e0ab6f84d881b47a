"""What a run is made of, and what it may cost: the one description ``up`` creates and ``up --plan`` shows (pure).

Names are the run's own: ``syncer`` (and ``syncer-s1``.. for the other shards of
a sharded synchronizer) and ``L0``..``L{M-1}`` (each learner name is a
data shard), handed out region by region in file order; a learner over several
VMs (``nodes:``) adds ``L0-n1``.. for the rest of them. Providers add the run
to their labels. Each instance carries its placements, the order failover tries:
its region's zones, then its fallback regions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddctl.config import synchronizer
from ddctl.config.regions import Region, RegionsFile, job_config
from ddctl.control.reconcile import Action, Desired, Placement
from ddctl.providers import KINDS
from ddctl.providers.base import syncer_name
from ddctl_agents.core import shardmap
from ddctl_agents.core.shardmap import ShardMap

if TYPE_CHECKING:
    from ddctl.control.quotes import PlanQuotes


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedInstance:
    name: str
    region: str
    provider: str
    role: str
    instance_type: str
    spot: bool
    max_dollars_per_hour: float | None
    """0 for local regions; the region's price cap for clouds; None when no cap bounds it."""
    placements: tuple[Placement, ...]
    learner: str = ""
    """The learner this VM is a node of ("" for the syncer): a learner over ``nodes:`` VMs is several instances."""
    node: int = 0
    """Which of its learner's VMs: node 0 hosts the learner's rendezvous and is made first."""
    nodes: int = 1
    shard: str = ""
    """The synchronizer shard this instance is (S0, S1, ...) in a sharded run; "" for learners and a lone syncer."""
    relay: str = ""
    """In a region the plan gives a relay: "host" for its first learner, which runs the relay, "served" for its other
    learners; "" elsewhere, and for the syncer."""


@dataclass(frozen=True, slots=True)
class SyncerShard:
    """One synchronizer process of a run: its instance name, its shard ("" when it is the only one) and region."""

    name: str
    shard: str
    region: str


def syncer_shards(rf: RegionsFile) -> list[SyncerShard]:
    """The run's synchronizer processes: ``syncer`` alone, or one per shard of the plan (``syncer``, ``syncer-s1``, ...)
    in the regions the plan places them; shard i owns the fragments the plan assigns it (``shard_map``)."""
    if rf.synchronizer is None:
        return [SyncerShard("syncer", "", rf.syncer)]
    shards = synchronizer.shard_plan(rf, job_config(rf)).shards
    if len(shards) == 1:
        return [SyncerShard("syncer", "", shards[0].site)]
    return [SyncerShard(syncer_name(s.index), f"S{s.index}", s.site) for s in shards]


def shard_map(rf: RegionsFile) -> ShardMap:
    """The map a sharded run's shards start from: the plan's fragment-to-shard assignment, epoch 1."""
    return shardmap.from_assignment(synchronizer.shard_plan(rf, job_config(rf)).owner)


def node_name(learner: str, node: int) -> str:
    """A learner's instance names: its own for node 0 (its data shard), ``L0-n1``.. for the rest of its VMs."""
    return learner if node == 0 else f"{learner}-n{node}"


def learner_names(rf: RegionsFile) -> dict[str, list[str]]:
    """Learner names L0..L{M-1}, handed out region by region in file order (each name is a data shard)."""
    names: dict[str, list[str]] = {}
    next_index = 0
    for region in rf.regions:
        names[region.name] = [f"L{next_index + i}" for i in range(region.learners)]
        next_index += region.learners
    return names


def price(region: Region, kind: str | None = None) -> float | None:
    """USD per instance-hour: 0 for regions played on this machine, the price cap for clouds, None when unbounded."""
    chosen = KINDS.get(kind or region.provider)
    return 0.0 if chosen is not None and chosen.local else region.price_cap


def placements(region: Region, kind: str, role: str = "learner") -> tuple[Placement, ...]:
    """Where an instance of ``region`` may run, in failover order: its zones, then its fallback regions. Not a
    synchronizer's (the syncer, a shard): its address is reserved in its region, where every learner and the job's
    certificate know it, and a regional address cannot follow it to another region."""
    home = region.cloud_region or region.name
    zones = region.zones or ("",)
    return (
        *(Placement(provider=kind, cloud_region=home, zone=z) for z in zones),
        *(Placement(provider=kind, cloud_region=r) for r in region.fallback_regions if role != "syncer"),
    )


def plan(rf: RegionsFile, kinds: dict[str, str]) -> list[PlannedInstance]:
    """The synchronizer (``rf.syncer``, or each shard where the plan places it) and every learner; ``kinds`` is each
    region's provider (a dry run's local one)."""
    out = []
    names = learner_names(rf)
    shards = syncer_shards(rf)
    relays = synchronizer.shard_plan(rf, job_config(rf)).relay
    for region in rf.regions:
        syncers = [s for s in shards if s.region == region.name]
        members = [(learner, k) for learner in names[region.name] for k in range(region.nodes)]
        for syncer, learner, k in [(s, "", 0) for s in syncers] + [(None, n, k) for n, k in members]:
            role = "syncer" if syncer is not None else "learner"
            spot = region.spot and role != "syncer"  # the syncer runs on demand: its loss stalls every merge
            cap = price(region, kinds[region.name])
            out.append(
                PlannedInstance(
                    name=syncer.name if syncer is not None else node_name(learner, k),
                    learner=learner,
                    node=k,
                    nodes=region.nodes if learner else 1,
                    shard=syncer.shard if syncer is not None else "",
                    relay=("host" if learner == names[region.name][0] else "served") if learner and relays[region.name] else "",
                    region=region.name,
                    provider=kinds[region.name],
                    role=role,
                    instance_type=" | ".join(region.types),
                    spot=spot,
                    max_dollars_per_hour=cap if spot or cap == 0.0 else None,  # a cap bounds spot bids only
                    placements=placements(region, kinds[region.name], role),
                )
            )
    return sorted(out, key=lambda i: (i.role != "syncer", i.learner, i.node, len(i.name), i.name))


def desired(instances: list[PlannedInstance], done: Collection[str] = ()) -> list[Desired]:
    """The plan as reconcile wants it; ``done``: the instances whose work is finished (never started again)."""
    return [
        Desired(name=i.name, role=i.role, placements=i.placements, group=i.learner, node=i.node, done=i.name in done)
        for i in instances
    ]


def plan_summary(
    rf: RegionsFile,
    kinds: dict[str, str],
    actions: list[Action] | None = None,
    quotes: PlanQuotes | None = None,
    done: Collection[str] = (),
) -> dict[str, Any]:
    """The plan as ``up --plan`` prints it; ``gpus``, ``nodes``: each region's ranks per VM and VMs per learner;
    with ``actions``, what ``up`` would do about each instance now (``done``: those whose work is finished); with
    ``quotes``, each region's prices, egress and warnings, and the totals (a learner's every VM counted)."""
    instances = plan(rf, kinds)
    known = [i.max_dollars_per_hour for i in instances if i.max_dollars_per_hour is not None]
    todo: dict[str, tuple[str, str]] = {
        a.name: (a.kind, a.reason) for a in actions or [] if a.kind in ("create", "replace", "wait", "give_up")
    }
    todo |= {name: ("done", "finished its work; not started again") for name in done}
    return {
        "run": rf.run,
        "syncer_region": rf.syncer,
        "learners": rf.learners,
        "gpus": {r.name: r.ranks for r in rf.regions},
        "nodes": {r.name: r.nodes for r in rf.regions},
        "instances": [
            {
                "name": i.name,
                "region": i.region,
                "provider": i.provider,
                "role": i.role,
                "instance_type": i.instance_type,
                "spot": i.spot,
                "max_dollars_per_hour": i.max_dollars_per_hour,
                "relay": i.relay,
                "action": todo.get(i.name, ("keep", "running"))[0],
                "reason": todo.get(i.name, ("keep", "running"))[1],
            }
            for i in instances
        ],
        "max_dollars_per_hour": round(sum(known), 4),
        "unpriced": sorted({i.region for i in instances if i.max_dollars_per_hour is None}),
    } | (
        quotes.summary(rf, kinds, Counter(i.region for i in instances), Counter(i.region for i in instances if not i.spot))
        if quotes is not None
        else {}
    )
