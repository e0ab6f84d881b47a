"""What a plan costs per region, from the job's own traffic and each cloud's prices: the money of ``up --plan``.

The job's configuration gives the traffic (``sync_traffic``): every H inner steps a learner sends
each fragment's outer gradient once (``sync.codec``, int4 by default, with its block scales) and
receives each fragment's new version once (``down_codec``, bf16 by default; ``int8-delta`` as its
steady state, an int8 step), in the wire frames of ``ddctl_agents.core.wire``. Egress is what
leaves a region (``egress_bytes``): a learner's uploads leave its region, the syncer's sends to
learners leave the syncer's (a sharded one's: each shard's share, from its region), each region's
at its planned cadence. A cloud provider prices its
own regions with the module its registry entry names (``Kind.prices``: ``quote_regions`` and
``notes``, as ``providers/aws/prices.py``); regions played on this machine cost 0 and call nothing.

The sizes are computed without torch (``ddctl --help`` and ``up --plan`` stay light):
``model_tensors`` mirrors ``train/model.py`` and ``payload_bytes`` the codec's wire contract;
``tests/test_aws_prices.py`` holds both to the real model and the real codec.
"""

from __future__ import annotations

import importlib
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ddctl.config import synchronizer
from ddctl.config.regions import Region, RegionsFile, job_config
from ddctl.config.train import ClusterConfig
from ddctl.control.jobdata import model_shapes
from ddctl.control.plan import plan
from ddctl.providers import KINDS
from ddctl_agents.core.choices import wire_codec
from ddctl_agents.train.config import ModelConfig
from ddctl_agents.train.job import JobConfig
from ddctl_agents.train.presets import model_config

STEP_S = ClusterConfig().step_time_s
"""Seconds per inner step when nothing better is known: the simulator's nominal step. Nothing in the
repository measures a preset's step on a cloud instance yet (learners train on the CPU), so the plan
shows this as an assumption; egress scales with 1 / step time."""
GB = 1e9
"""Decimal GB: if a cloud meters 2^30-byte GB the true cost is 7% lower; the plan errs high."""
_PER_BYTE = {"int8": 1, "int4": 2, "int2": 4, "int1": 8}
_ELEMENT_BYTES = {"fp32": 4, "bf16": 2}
_SCALE_BYTES = 4
_FRAME_BYTES = {"update": 256, "fragment": 96}
"""Fixed bytes of one frame: prefix, CRC and the JSON header's metadata (an update carries more)."""
_TENSOR_ENTRY_BYTES = 96
"""The header's table entry of one tensor (name, shape, offset, nbytes)."""


def model_tensors(config: ModelConfig) -> list[tuple[str, int]]:
    """(name, elements) of every parameter of ``train/model.py``'s GPT for ``config``, without building it."""
    d, hidden = config.d_model, config.mlp_ratio * config.d_model

    def linear(name: str, n_in: int, n_out: int, bias: bool = True) -> list[tuple[str, int]]:
        return [(f"{name}.weight", n_in * n_out)] + ([(f"{name}.bias", n_out)] if bias else [])

    def norm(name: str) -> list[tuple[str, int]]:
        return [(f"{name}.weight", d), (f"{name}.bias", d)]

    def mlp(name: str) -> list[tuple[str, int]]:
        return linear(f"{name}.fc", d, hidden) + linear(f"{name}.proj", hidden, d)

    out = [("wte.weight", config.vocab_size * d), ("wpe.weight", config.seq_len * d)]
    for i in range(config.n_layer):
        b = f"blocks.{i}"
        out += norm(f"{b}.ln_1") + linear(f"{b}.attn.qkv", d, 3 * d) + linear(f"{b}.attn.proj", d, d) + norm(f"{b}.ln_2")
        if config.n_experts:
            out += linear(f"{b}.ffn.router", d, config.n_experts, bias=False)
            out += [t for e in range(config.n_experts) for t in mlp(f"{b}.ffn.experts.{e}")]
        else:
            out += mlp(f"{b}.ffn")
    out += norm("ln_f") + ([] if config.tie_embeddings else linear("lm_head", d, config.vocab_size, bias=False))
    return out


def payload_bytes(codec: str, numel: int, block: int) -> int:
    """Bytes of one tensor of ``numel`` values in ``codec`` (the wire contract of ``core/codec.py``)."""
    if codec in _ELEMENT_BYTES:
        return _ELEMENT_BYTES[codec] * numel
    return _SCALE_BYTES * -(-numel // block) + -(-numel // _PER_BYTE[codec])


def sync_bytes(sizes: list[int], codec: str, block: int, fragments: int, kind: str) -> int:
    """Bytes on the wire for every fragment once: one frame per fragment, each tensor in one of them."""
    frames = min(fragments, len(sizes))
    return frames * _FRAME_BYTES[kind] + sum(payload_bytes(codec, n, block) + _TENSOR_ENTRY_BYTES for n in sizes)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncTraffic:
    """One learner's traffic per outer sync (every fragment once), and how often it syncs."""

    up_bytes: int
    down_bytes: int
    inner_steps: int
    step_s: float

    @property
    def syncs_per_hour(self) -> float:
        return 3600.0 / (self.inner_steps * self.step_s)

    def assumption(self) -> str:
        return (
            f"egress: a learner sends {self.up_bytes / 1e6:.2f} MB and receives {self.down_bytes / 1e6:.2f} MB per sync "
            f"(every {self.inner_steps} inner steps), {self.syncs_per_hour:.0f} syncs/h at an assumed {self.step_s:g} s "
            "per step (nothing measured yet; egress scales with 1/step time)"
        )


def tensor_sizes(job: JobConfig) -> list[int]:
    """Elements of each of the job's parameter tensors: the built-in's from its shape, yours by building it."""
    if job.inner.model:
        return [math.prod(shape) for shape in model_shapes(job.inner).values()]
    return [n for _, n in model_tensors(model_config(job.inner))]


def sync_traffic(job: JobConfig, step_s: float = STEP_S) -> SyncTraffic:
    """The job's own traffic: its model's tensors in its codecs, its fragments, its H."""
    sizes = tensor_sizes(job)
    sync = job.sync
    return SyncTraffic(
        up_bytes=sync_bytes(sizes, sync.codec, sync.block, sync.fragments, "update"),
        down_bytes=sync_bytes(sizes, wire_codec(job.down_codec), sync.block, sync.fragments, "fragment"),
        inner_steps=sync.inner_steps,
        step_s=step_s,
    )


def route(a: Region, kind_a: str, b: Region, kind_b: str) -> str:
    """How bytes from ``a`` reach ``b``: ``same_region``, ``inter_region`` (same cloud) or ``internet``."""
    if kind_a == kind_b and (_local(kind_a) or a.cloud_region == b.cloud_region):
        return "same_region"
    return "inter_region" if kind_a == kind_b else "internet"


def _local(kind: str) -> bool:
    return kind in KINDS and KINDS[kind].local


def flows(rf: RegionsFile, kinds: Mapping[str, str], traffic: SyncTraffic) -> Iterator[tuple[Region, Region, str, float]]:
    """Every stream of sync bytes that leaves a region: (from, to, route, bytes per hour), as ``up`` runs the plan.

    A learner region's uploads go to the synchronizer's region, or each fragment's to its shard's (a share per
    shard region: its fragments over the job's, as the scheduler counts them), and the versions come back, at the
    region's planned cadence (every k-th period); what stays inside a region (a synchronizer's own region, or local
    regions on one machine) leaves nothing."""
    plan = synchronizer.shard_plan(rf, job_config(rf))
    shares: dict[str, float] = {rf.syncer: 1.0}
    if rf.synchronizer is not None:
        shares = {s.site: 0.0 for s in plan.shards}
        for shard in plan.shards:
            shares[shard.site] += len(shard.fragments) / len(plan.owner)
    for host in (rf.region(name) for name in sorted(shares)):
        for region in rf.regions:
            way = route(region, kinds[region.name], host, kinds[host.name])
            if region.name == host.name or way == "same_region":
                continue
            syncs = region.learners * traffic.syncs_per_hour * shares[host.name] / plan.cadence.get(region.name, 1)
            yield region, host, way, syncs * traffic.up_bytes
            yield host, region, way, syncs * traffic.down_bytes


def egress_bytes(rf: RegionsFile, kinds: Mapping[str, str], traffic: SyncTraffic) -> dict[str, dict[str, float]]:
    """Bytes per hour leaving each region, by route: learners' uploads from theirs, the syncer's sends from its own."""
    out: dict[str, dict[str, float]] = {r.name: {} for r in rf.regions}
    for source, _, way, sent in flows(rf, kinds, traffic):
        out[source.name][way] = out[source.name].get(way, 0.0) + sent
    return out


def cloud_pairs(rf: RegionsFile, kinds: Mapping[str, str], traffic: SyncTraffic) -> list[dict[str, Any]]:
    """Egress per (from, to) provider pair: GB and USD per hour at the sending cloud's rate (None: unknown)."""
    gb: dict[tuple[str, str], float] = {}
    dollars: dict[tuple[str, str], float | None] = {}
    for source, sink, way, sent in flows(rf, kinds, traffic):
        pair, rate = (kinds[source.name], kinds[sink.name]), _egress_rate(kinds[source.name], way, source.cloud_region)
        gb[pair] = gb.get(pair, 0.0) + sent / GB
        so_far = dollars.get(pair, 0.0)
        dollars[pair] = None if rate is None or so_far is None else so_far + sent / GB * rate
    return [
        {"from": a, "to": b, "gb_per_hour": round(gb[a, b], 3),
         "dollars_per_hour": None if (d := dollars[a, b]) is None else round(d, 4)}
        for a, b in sorted(gb)
    ]  # fmt: skip


def _egress_rate(kind: str, way: str, cloud_region: str) -> float | None:
    """USD per GB leaving ``cloud_region`` of ``kind`` by ``way``; 0 on this machine, None where unknown."""
    if _local(kind):
        return 0.0
    prices = _prices_of(kind)
    rate = prices.egress_per_gb(way, cloud_region) if prices is not None else None
    return None if rate is None else float(rate)


@dataclass(frozen=True, slots=True, kw_only=True)
class RegionQuote:
    """One region of a plan: its instance type and zone, USD per instance-hour, its egress per hour; None is unknown."""

    instance_type: str
    zone: str
    spot: bool
    """The region runs spot instances (else on demand)."""
    spot_per_hour: float | None
    on_demand_per_hour: float | None
    vcpus: int | None
    egress_gb_per_hour: float
    """What leaves the region per hour (the region's learners' uploads; for the syncer's, its sends to learners)."""
    egress_per_hour: float | None
    warnings: tuple[str, ...] = ()

    @property
    def per_hour(self) -> float | None:
        """What one instance costs an hour as the region runs it: spot or on demand."""
        return self.spot_per_hour if self.spot else self.on_demand_per_hour


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanCost:
    """A plan's USD per hour; the sums leave out the figures of the regions in ``unknown``."""

    per_hour: float
    """Every instance at the price it runs at (spot where spot)."""
    on_demand_per_hour: float
    """Every instance on demand, for comparison."""
    egress_per_hour: float
    unknown: tuple[str, ...]

    @property
    def total_per_hour(self) -> float:
        return round(self.per_hour + self.egress_per_hour, 4)


def plan_cost(
    quotes: Mapping[str, RegionQuote], counts: Mapping[str, int], on_demand_counts: Mapping[str, int] | None = None
) -> PlanCost:
    """The plan's totals from each region's quote and its instance count (pure).

    ``on_demand_counts``: of those, the instances that run on demand whatever the region says (the syncer)."""
    per_hour = on_demand = egress = 0.0
    unknown = []
    for name, quote in quotes.items():
        n, fixed = counts.get(name, 0), (on_demand_counts or {}).get(name, 0)
        if None in (quote.per_hour, quote.on_demand_per_hour, quote.egress_per_hour):
            unknown.append(name)
        per_hour += (n - fixed) * (quote.per_hour or 0.0) + fixed * (quote.on_demand_per_hour or 0.0)
        on_demand += n * (quote.on_demand_per_hour or 0.0)
        egress += quote.egress_per_hour or 0.0
    return PlanCost(
        per_hour=round(per_hour, 4),
        on_demand_per_hour=round(on_demand, 4),
        egress_per_hour=round(egress, 4),
        unknown=tuple(unknown),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanQuotes:
    """Every region's quote and what the figures rest on."""

    regions: dict[str, RegionQuote]
    notes: tuple[str, ...]
    pairs: tuple[dict[str, Any], ...] = ()
    """Egress per (from, to) provider pair (``cloud_pairs``)."""

    def summary(
        self, rf: RegionsFile, kinds: Mapping[str, str], counts: Mapping[str, int], on_demand_counts: Mapping[str, int]
    ) -> dict[str, Any]:
        """The plan's money as ``up --plan`` prints it (and ``--json`` gives it)."""
        cost = plan_cost(self.regions, counts, on_demand_counts)
        rows = []
        for region in rf.regions:
            quote = self.regions[region.name]
            where = {"region": region.name, "provider": kinds[region.name], "cloud_region": region.cloud_region}
            figures = {k: getattr(quote, k) for k in RegionQuote.__dataclass_fields__} | {"warnings": list(quote.warnings)}
            rows.append(where | {"instances": counts.get(region.name, 0)} | figures)
        money = {
            "dollars_per_hour": cost.per_hour,
            "on_demand_dollars_per_hour": cost.on_demand_per_hour,
            "egress_dollars_per_hour": cost.egress_per_hour,
            "total_dollars_per_hour": cost.total_per_hour,
            "unknown": list(cost.unknown),
            "egress_by_cloud": list(self.pairs),
            "notes": list(self.notes),
        }
        return {"regions": rows, "cost": money}


def _flat(region: Region, leaving: Mapping[str, float], price: float | None, warning: str = "") -> RegionQuote:
    """A region without a cloud quote: local (``price`` 0, nothing billed) or a cloud ddctl cannot price (None)."""
    return RegionQuote(
        instance_type="",
        zone="",
        spot=region.spot,
        spot_per_hour=price,
        on_demand_per_hour=price,
        vcpus=None,
        egress_gb_per_hour=0.0 if price == 0 else round(sum(leaving.values()) / GB, 3),
        egress_per_hour=price,
        warnings=(warning,) if warning else (),
    )


def _prices_of(kind: str) -> Any:
    """The provider's price module (``Kind.prices``), or None for a provider without prices (or not built)."""
    chosen = KINDS.get(kind)
    return importlib.import_module(chosen.prices) if chosen is not None and chosen.prices else None


def quote_plan(rf: RegionsFile, kinds: dict[str, str]) -> PlanQuotes:
    """Quote every region of the plan (read-only cloud calls; none for local regions)."""
    traffic = sync_traffic(job_config(rf))
    leaving = egress_bytes(rf, kinds, traffic)
    planned = plan(rf, kinds)
    counts = Counter(i.region for i in planned)
    on_demand = Counter(i.region for i in planned if not i.spot)
    quotes: dict[str, RegionQuote] = {}
    notes = [traffic.assumption()]
    for kind in sorted(set(kinds.values())):
        regions = [r for r in rf.regions if kinds[r.name] == kind]
        prices = None if _local(kind) else _prices_of(kind)
        if prices is not None:
            quotes.update(prices.quote_regions(regions, counts, leaving, on_demand_counts=on_demand))
            notes += prices.notes()
            continue
        unknown = "" if _local(kind) else f"ddctl knows no {kind} prices yet"
        quotes.update({r.name: _flat(r, leaving[r.name], None if unknown else 0.0, unknown) for r in regions})
    return PlanQuotes(regions=quotes, notes=tuple(notes), pairs=tuple(cloud_pairs(rf, kinds, traffic)))
