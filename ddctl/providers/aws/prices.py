"""What an AWS region of a plan costs, and whether the account may run it: the figures ``up --plan`` shows.

Read-only calls only (EC2 ``DescribeSpotPriceHistory`` and ``DescribeInstanceTypes``, Service
Quotas ``GetServiceQuota``), on clients handed in, so tests point them at moto.

- Spot: EC2's own price history, read now; each (type, zone) at its latest price; the cheapest
  allowed zone over the region's preference list of types.
- On-demand: EC2 has no price call (the Pricing API is another service and another permission),
  so a dated list-price table; a type or region outside it is None ("unknown"), never guessed.
- Quotas: spot (or on-demand) capacity is capped per region in vCPUs per class of families; a plan
  that needs more fails at ``up``, so the preflight says so first, and says so when it cannot tell.
- Egress: AWS's data-transfer rates, dated; which bytes leave which region is the caller's sum.
- GPUs: a dated table of the NVIDIA GPUs each GPU type comes with (``gpus``), which default and bound ranks per learner.

``quote_regions`` and ``notes`` are what ``control/quotes.py`` asks of a provider's ``prices`` module.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ddctl.control.quotes import GB, RegionQuote
from ddctl.errors import DdctlError
from ddctl.providers.aws.answers import paged
from ddctl.providers.aws.clients import Clients
from ddctl.providers.base import own_or_attached_gpus

if TYPE_CHECKING:
    from ddctl.config.regions import Region

ON_DEMAND_AS_OF = "2026-06"
"""us-east-1 Linux list prices (shared tenancy), USD per instance-hour. g5.xlarge ($1.006) checked
against a June 2026 summary of AWS's rate card; p4d and p5 after AWS's June 2025 cut (-33%, -45%);
the rest as AWS published them at launch, unchanged since as far as we know. Check before you trust
a cent: https://aws.amazon.com/ec2/pricing/on-demand/"""
_US_EAST_1: dict[str, float] = {
    "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g4dn.4xlarge": 1.204, "g4dn.8xlarge": 2.176,
    "g4dn.12xlarge": 3.912, "g4dn.16xlarge": 4.352,
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624, "g5.8xlarge": 2.448,
    "g5.12xlarge": 5.672, "g5.16xlarge": 4.096, "g5.24xlarge": 8.144, "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.4xlarge": 1.3232, "g6.8xlarge": 2.0144,
    "g6.12xlarge": 4.6016, "g6.16xlarge": 3.3968, "g6.24xlarge": 6.6752, "g6.48xlarge": 13.3504,
    "g6e.xlarge": 1.861, "g6e.2xlarge": 2.24208, "g6e.4xlarge": 3.00424, "g6e.8xlarge": 4.52856,
    "g6e.12xlarge": 10.49264, "g6e.16xlarge": 7.57719, "g6e.24xlarge": 15.06559, "g6e.48xlarge": 30.13118,
    "p4d.24xlarge": 21.96, "p5.48xlarge": 55.04,
    "c7i.large": 0.08925, "m7i.large": 0.1008, "t3.medium": 0.0416,
}  # fmt: skip
REGION_FACTOR: dict[str, float] = {
    "us-east-1": 1.0, "us-west-2": 1.0, "eu-west-1": 1.12, "eu-central-1": 1.2, "ap-northeast-1": 1.3,
}  # fmt: skip
"""A region's list prices over us-east-1's, typical for these families; single types differ by up to ~10%."""

GPUS_AS_OF = "2026-12"
_G_SIZES: dict[str, int] = {
    "xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8,
}  # fmt: skip
"""GPUs per size in g5, g6 and g6e; g4dn has the sizes up to 16xlarge, and a metal one."""
BUILT_IN_GPUS: dict[str, tuple[str, int]] = {
    **{f"g4dn.{size}": ("nvidia-t4", n) for size, n in _G_SIZES.items() if size not in ("24xlarge", "48xlarge")},
    "g4dn.metal": ("nvidia-t4", 8),
    **{
        f"{family}.{size}": (model, n)
        for family, model in (("g5", "nvidia-a10g"), ("g6", "nvidia-l4"), ("g6e", "nvidia-l40s"))
        for size, n in _G_SIZES.items()
    },
    "p4d.24xlarge": ("nvidia-a100", 8), "p4de.24xlarge": ("nvidia-a100-80gb", 8),
    "p5.48xlarge": ("nvidia-h100", 8), "p5e.48xlarge": ("nvidia-h200", 8),
}  # fmt: skip
"""The NVIDIA GPUs the GPU types ddctl is likely to meet come with, as of ``GPUS_AS_OF``, as EC2's
``DescribeInstanceTypes`` GpuInfo gives them (its name lowercased after "nvidia-"; "-80gb" where the A100 comes
in two sizes; a test holds the table to the answers moto copies from EC2). A type outside it has no GPU ddctl
knows of: 1 rank per learner unless ``gpus:`` says more."""

EGRESS_AS_OF = "2026-06"
EGRESS_PER_GB: dict[str, float] = {"inter_region": 0.02, "internet": 0.09}
"""USD per GB leaving an AWS region: to another AWS region, or to the internet (another cloud; first
10 TB a month). Within a region it is 0 here; AWS bills $0.01/GB each way between zones, not counted."""
_EGRESS_FROM: dict[str, dict[str, float]] = {"ap-northeast-1": {"inter_region": 0.09, "internet": 0.114}}
"""Source regions that charge more than ``EGRESS_PER_GB`` (Tokyo)."""


def on_demand_price(instance_type: str, region: str) -> float | None:
    """USD per instance-hour on demand, or None when the table does not know the type or the region."""
    base, factor = _US_EAST_1.get(instance_type), REGION_FACTOR.get(region)
    return None if base is None or factor is None else round(base * factor, 4)


def gpus(instance_type: str, accelerator: str = "", count: int = 1) -> tuple[str, int] | None:
    """The GPU model and how many an instance runs: its type's own, else what the regions file names; None without."""
    return own_or_attached_gpus(BUILT_IN_GPUS, instance_type, accelerator, count)


def egress_per_gb(route: str, region: str) -> float:
    """USD per GB leaving ``region`` by ``route`` (``inter_region`` or ``internet``; anything else is free)."""
    return _EGRESS_FROM.get(region, EGRESS_PER_GB).get(route, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpotQuote:
    instance_type: str
    zone: str
    price: float
    """USD per instance-hour, Linux/UNIX, in effect now."""


Offers = dict[tuple[str, str], float]
"""Spot USD per hour by (instance type, zone)."""


MAX_DOLLARS_PER_HOUR = 1_000.0
"""No instance type costs more an hour (p5.48xlarge lists near $55): a larger price is a broken answer."""
MAX_VCPUS = 4_096
MAX_QUOTA_VCPUS = 10_000_000.0


def checked(raw: Any, low: float, high: float) -> float | None:
    """A number an API answered, if it is one and finite within [low, high]; None otherwise (never guessed)."""
    if isinstance(raw, bool):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) and low <= value <= high else None


def latest_prices(history: Iterable[Mapping[str, Any]], instance_types: Sequence[str], zones: Sequence[str]) -> Offers:
    """Each allowed (type, zone) at its latest usable price in EC2's history (pure); malformed items are skipped."""
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for item in history:
        key = (str(item.get("InstanceType", "")), str(item.get("AvailabilityZone", "")))
        if key[0] not in instance_types or (zones and key[1] not in zones):
            continue  # EC2 filters too; a canned or older answer may not
        price = checked(item.get("SpotPrice"), 0.0, MAX_DOLLARS_PER_HOUR)
        stamp = item.get("Timestamp")
        stamp = stamp if isinstance(stamp, datetime) and stamp.tzinfo is not None else datetime.min.replace(tzinfo=UTC)
        if price is not None and price > 0 and (key not in latest or stamp > latest[key][0]):
            latest[key] = (stamp, price)
    return {key: price for key, (_, price) in latest.items()}


def cheapest(offers: Offers, instance_types: Sequence[str]) -> SpotQuote | None:
    """The cheapest offer; a tie goes to the earlier type, then the zone first by name (pure)."""
    if not offers:
        return None
    rank = {t: i for i, t in enumerate(instance_types)}
    (kind, zone), price = min(offers.items(), key=lambda kv: (kv[1], rank.get(kv[0][0], len(rank)), kv[0][1]))
    return SpotQuote(instance_type=kind, zone=zone, price=price)


def spot_prices(ec2: Any, instance_types: Sequence[str], zones: Sequence[str], now: datetime | None = None) -> Offers:
    """Spot prices in effect now for ``instance_types`` in ``zones`` (empty: any zone of the region)."""
    if not instance_types:
        return {}
    query: dict[str, Any] = {
        "InstanceTypes": list(instance_types),
        "ProductDescriptions": ["Linux/UNIX"],
        "StartTime": now or datetime.now(UTC),  # from now: the price in effect now, per (type, zone)
    }
    if zones:
        query["Filters"] = [{"Name": "availability-zone", "Values": list(zones)}]
    pages = ec2.get_paginator("describe_spot_price_history").paginate(**query)
    return latest_prices(paged(pages, "SpotPriceHistory", "DescribeSpotPriceHistory"), instance_types, zones)


def spot_quote(ec2: Any, instance_types: Sequence[str], zones: Sequence[str], now: datetime | None = None) -> SpotQuote | None:
    """The cheapest spot offer now over ``instance_types`` in ``zones`` (empty: any zone of the region)."""
    return cheapest(spot_prices(ec2, instance_types, zones, now), instance_types)


def vcpus(ec2: Any, instance_types: Sequence[str]) -> dict[str, int]:
    """vCPUs per instance type, as EC2 describes it (quotas count vCPUs, not instances)."""
    pages = ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=list(instance_types))
    out = {}
    for t in paged(pages, "InstanceTypes", "DescribeInstanceTypes"):
        info = t.get("VCpuInfo")
        count = checked(info.get("DefaultVCpus"), 1, MAX_VCPUS) if isinstance(info, dict) else None
        if count is not None and count == int(count):  # a broken answer leaves the type's vCPUs unknown
            out[str(t.get("InstanceType", ""))] = int(count)
    return out


@dataclass(frozen=True, slots=True)
class Quota:
    code: str
    name: str


_QUOTAS: dict[str, tuple[str, str, str, str]] = {  # family: spot code and name, on-demand code and name
    "standard": ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests",
                 "L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    "g": ("L-3819A6DF", "All G and VT Spot Instance Requests", "L-DB2E81BA", "Running On-Demand G and VT instances"),
    "p": ("L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests", "L-417A185B", "Running On-Demand P instances"),
    "p5": ("L-C4BD4855", "All P5 Spot Instance Requests", "L-417A185B", "Running On-Demand P instances"),
    "inf": ("L-B5D1601B", "All Inf Spot Instance Requests", "L-1945791B", "Running On-Demand Inf instances"),
    "trn": ("L-6B0D517C", "All Trn Spot Instance Requests", "L-2C3B7624", "Running On-Demand Trn instances"),
    "dl": ("L-85EED4F7", "All DL Spot Instance Requests", "L-6E869C2A", "Running On-Demand DL instances"),
    "f": ("L-88CF9481", "All F Spot Instance Requests", "L-74FC7D96", "Running On-Demand F instances"),
    "x": ("L-E3A00192", "All X Spot Instance Requests", "L-7295265B", "Running On-Demand X instances"),
}  # fmt: skip
"""Codes and names as AWS's page "Amazon EC2 instance type quotas" lists them (Service Quotas, service
``ec2``; vCPUs per region). Newer P families (p6) are left out: sources disagree on their spot quota."""
SPOT_QUOTAS = {family: Quota(q[0], q[1]) for family, q in _QUOTAS.items()}
ON_DEMAND_QUOTAS = {family: Quota(q[2], q[3]) for family, q in _QUOTAS.items()}


def quota_for(instance_type: str, *, spot: bool) -> Quota | None:
    """The vCPU quota that ``instance_type`` draws from, or None when we do not know it (pure)."""
    match = re.match(r"([a-z]+)(\d+)", instance_type)
    if match is None:
        return None
    letters, generation = match.groups()
    if letters in ("g", "gr", "vt"):
        family: str | None = "g"
    elif letters == "p":
        family = {"2": "p", "3": "p", "4": "p", "5": "p5"}.get(generation)
    elif letters in ("inf", "trn", "dl", "f", "x"):
        family = letters
    elif letters[0] in "acdhimrtz" and letters not in ("hpc", "mac"):
        family = "standard"
    else:
        family = None
    return None if family is None else (SPOT_QUOTAS if spot else ON_DEMAND_QUOTAS)[family]


def quota_shortfall(quota: Quota, value: float, needed: int, region: str) -> str | None:
    """A warning when ``value`` vCPUs of ``quota`` cannot hold ``needed``, with the command that asks for more (pure)."""
    if value >= needed and value > 0:
        return None
    return (
        f"{region}: quota {quota.code} ({quota.name}) is {value:g} vCPUs, the plan needs {needed} "
        "(instances already running count against it too); up would be refused: raise it with "
        f"aws service-quotas request-service-quota-increase --region {region} --service-code ec2 "
        f"--quota-code {quota.code} --desired-value {needed}"
    )


def quota_warnings(service_quotas: Any, region: str, needs: Mapping[Quota, int], credentials: str = "") -> list[str]:
    """Each quota the plan needs in ``region`` against what the account has; a quota we cannot read is a warning too."""
    from botocore.exceptions import BotoCoreError, ClientError

    from ddctl.providers.aws.errors import classify

    out = []
    for quota, needed in sorted(needs.items(), key=lambda kv: kv[0].code):
        try:
            answered = service_quotas.get_service_quota(ServiceCode="ec2", QuotaCode=quota.code)
        except (BotoCoreError, ClientError) as exc:
            raw, why = None, str(classify(exc, region=region, credentials=credentials))
        else:
            found = answered.get("Quota") if isinstance(answered, dict) else None
            raw = found.get("Value") if isinstance(found, dict) else None
            why = f"Service Quotas answered {str(raw)[:40]!r}, not a number of vCPUs"
        value = checked(raw, 0.0, MAX_QUOTA_VCPUS)
        if value is None:
            out.append(f"{region}: could not check quota {quota.code} ({quota.name}; the plan needs {needed} vCPUs): {why}")
            continue
        problem = quota_shortfall(quota, value, needed, region)
        if problem:
            out.append(problem)
    return out


def notes() -> list[str]:
    """What the AWS figures rest on, for the plan to show."""
    rates = ", ".join(f"${rate}/GB {route.replace('_', '-')}" for route, rate in EGRESS_PER_GB.items())
    return [
        f"aws on-demand: list prices as of {ON_DEMAND_AS_OF} (us-east-1 x a regional factor); spot: EC2's price history now",
        f"aws egress as of {EGRESS_AS_OF}: {rates} (Tokyo more); free within a region (zone to zone not counted)",
    ]


def quote_regions(
    regions: Sequence[Region],
    counts: Mapping[str, int],
    leaving: Mapping[str, Mapping[str, float]],
    clients: Clients | None = None,
    on_demand_counts: Mapping[str, int] | None = None,
) -> dict[str, RegionQuote]:
    """Quote each AWS region of a plan: ``counts`` instances each, ``leaving`` bytes per hour by route.

    ``on_demand_counts``: of those, the instances on demand whatever the region says (the syncer): their
    vCPUs count against the on-demand quota. Quotas are per cloud region: the needs of regions that
    share one are summed, its warnings go to the first."""
    clients = clients or Clients()
    parts: dict[str, dict[str, Any]] = {}
    needs: dict[str, dict[Quota, int]] = {}
    for region in regions:
        count, fixed = counts.get(region.name, 0), (on_demand_counts or {}).get(region.name, 0)
        part, need = _quote_one(clients, region, count, fixed, leaving.get(region.name, {}))
        parts[region.name] = part
        for quota, vcpus_needed in need.items():
            bucket = needs.setdefault(region.cloud_region, {})
            bucket[quota] = bucket.get(quota, 0) + vcpus_needed
    for where, needed in needs.items():
        first = next(r.name for r in regions if r.cloud_region == where)
        parts[first]["warnings"] += quota_warnings(clients.client("service-quotas", where), where, needed, clients.described)
    return {name: RegionQuote(**{**p, "warnings": tuple(p["warnings"])}) for name, p in parts.items()}


def _quote_one(
    clients: Clients, region: Region, count: int, on_demand: int, out: Mapping[str, float]
) -> tuple[dict[str, Any], dict[Quota, int]]:
    """One region's figures (RegionQuote's fields) and the vCPUs it needs per quota (spot and on demand)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from ddctl.providers.aws.errors import classify

    where, types, warnings = region.cloud_region, tuple(region.types), []

    def told(exc: Exception) -> str:
        return str(exc) if isinstance(exc, DdctlError) else str(classify(exc, region=where, credentials=clients.described))

    ec2, spot, cpus = clients.client("ec2", where), None, None
    try:
        offers = spot_prices(ec2, types, region.zones)
        spot = cheapest(offers, types)
        if spot is None and types:
            warnings.append(f"{where}: no spot price for {', '.join(types)} in {', '.join(region.zones) or 'any zone'}")
        first = offers.get((types[0], region.zones[0])) if region.spot and types and region.zones else None
        if spot is not None and first is not None and first > spot.price:  # up tries types in order, zones in order
            warnings.append(
                f"{where}: up tries {types[0]} in {region.zones[0]} first (${first:.4f}/h); the cheapest is "
                f"{spot.instance_type} in {spot.zone}: list it first in instance_types and zones to pay that"
            )
    except (BotoCoreError, ClientError, DdctlError) as exc:  # DdctlError: an answer of another shape
        warnings.append(f"could not read spot prices: {told(exc)}")
    chosen = spot.instance_type if spot else (types[0] if types else "")
    if spot and region.spot and region.price_cap is not None and spot.price > region.price_cap:
        warnings.append(
            f"{where}: the spot price ${spot.price:.4f}/h is above price_cap ${region.price_cap}/h: up would get none"
        )
    try:
        cpus = vcpus(ec2, [chosen]).get(chosen) if chosen else None
    except (BotoCoreError, ClientError, DdctlError) as exc:
        warnings.append(f"could not read the vCPUs of {chosen}: {told(exc)}")
    quota = quota_for(chosen, spot=region.spot) if chosen else None
    if not chosen:
        warnings.append(f"{region.name}: no instance type given; nothing to price or check")
    elif quota is None or cpus is None:
        why = "its vCPUs are unknown" if cpus is None else "no known quota for its family"
        warnings.append(f"{where}: could not check the vCPU quota for {chosen}: {why}")
    egress = sum(b / GB * egress_per_gb(route, where) for route, b in out.items())
    part = {
        "instance_type": chosen,
        "zone": spot.zone if spot else "",
        "spot": region.spot,
        "spot_per_hour": spot.price if spot else None,
        "on_demand_per_hour": on_demand_price(chosen, where),
        "vcpus": cpus,
        "egress_gb_per_hour": round(sum(out.values()) / GB, 3),
        "egress_per_hour": round(egress, 4),
        "warnings": warnings,
    }
    spot_n = count - on_demand if region.spot else 0
    need: dict[Quota, int] = {}
    for market, n in ((True, spot_n), (False, count - spot_n)):
        code = quota_for(chosen, spot=market) if chosen else None
        if code is not None and cpus is not None and n > 0:
            need[code] = need.get(code, 0) + n * cpus
    return part, need
