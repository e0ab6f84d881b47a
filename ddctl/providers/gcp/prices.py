"""What a GCP region of a plan costs: the figures ``up --plan`` shows, from tables shipped with ddctl.

GCP has no spot price history ddctl can read offline (the Cloud Billing catalog needs credentials
and the network, and GCP moves spot prices up to once a month), so every figure here is a dated list
price and nothing leaves this machine:

- On-demand and spot: USD per VM-hour in us-central1 (g2/a2/a3 prices include their GPUs; N1 adds
  its attached GPUs per GPU-hour) times a regional factor. A type or region outside the tables is
  None ("unknown"), never guessed; the regions file's ``prices:`` win over the tables, and say so.
- Quotas: GCP caps GPUs per region per model (NVIDIA_L4_GPUS; PREEMPTIBLE_... for spot) and over
  all regions (GPUS_ALL_REGIONS). ddctl cannot read them offline: the plan names what it needs.
- Egress: premium-tier rates by source region, dated; which bytes leave which region is the caller's sum.

``quote_regions`` and ``notes`` are what ``control/quotes.py`` asks of a provider's ``prices`` module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ddctl.control.quotes import GB, RegionQuote
from ddctl.providers.base import own_or_attached_gpus

if TYPE_CHECKING:
    from ddctl.config.regions import Region

AS_OF = "2026-12"
"""us-central1 list prices, USD per VM-hour (Linux; no sustained- or committed-use discount), written
down in the month named from GCP's published rates (on demand: https://cloud.google.com/compute/vm-instance-pricing;
spot: https://cloud.google.com/spot-vms/pricing), rounded to 4 places; most as GCP set them in 2024-25,
unchanged since as far as we know. These are list prices, not a bill: check before you trust a cent."""
ON_DEMAND: dict[str, float] = {
    "g2-standard-4": 0.7068, "g2-standard-8": 0.8536, "g2-standard-12": 1.0004, "g2-standard-16": 1.1472,
    "g2-standard-24": 2.0008, "g2-standard-32": 1.7344, "g2-standard-48": 4.0016, "g2-standard-96": 8.0033,
    "a2-highgpu-1g": 3.6734, "a2-highgpu-2g": 7.3468, "a2-highgpu-4g": 14.6935, "a2-highgpu-8g": 29.3871,
    "a2-ultragpu-1g": 5.0688, "a2-ultragpu-8g": 40.5503, "a3-highgpu-8g": 88.2539,
    "n1-standard-4": 0.19, "n1-standard-8": 0.38, "n1-standard-16": 0.76,
    "e2-standard-2": 0.067, "e2-standard-4": 0.134, "e2-standard-8": 0.268,
    "n2-standard-4": 0.1942, "n2-standard-8": 0.3885,
}  # fmt: skip
SPOT: dict[str, float] = {
    "g2-standard-4": 0.2673, "g2-standard-8": 0.3110, "g2-standard-12": 0.3548, "g2-standard-16": 0.3985,
    "g2-standard-24": 0.7095, "g2-standard-32": 0.5734, "g2-standard-48": 1.4190, "g2-standard-96": 2.8381,
    "a2-highgpu-1g": 1.4694, "a2-highgpu-2g": 2.9387, "a2-highgpu-4g": 5.8774, "a2-highgpu-8g": 11.7548,
    "a2-ultragpu-1g": 2.0275, "a2-ultragpu-8g": 16.2201, "a3-highgpu-8g": 22.9,
    "n1-standard-4": 0.04, "n1-standard-8": 0.08, "n1-standard-16": 0.16,
    "e2-standard-2": 0.0201, "e2-standard-4": 0.0402, "e2-standard-8": 0.0804,
    "n2-standard-4": 0.047, "n2-standard-8": 0.094,
}  # fmt: skip
"""Spot, us-central1, as of ``AS_OF``. GCP sets spot per region and may move it once a month; elsewhere
this is us-central1's times ``REGION_FACTOR``, an approximation the notes state."""
VCPUS: dict[str, int] = {
    **{t: int(t.rsplit("-", 1)[1]) for t in ON_DEMAND if "-standard-" in t},
    "a2-highgpu-1g": 12, "a2-highgpu-2g": 24, "a2-highgpu-4g": 48, "a2-highgpu-8g": 96,
    "a2-ultragpu-1g": 12, "a2-ultragpu-8g": 96, "a3-highgpu-8g": 208,
}  # fmt: skip
BUILT_IN_GPUS: dict[str, tuple[str, int]] = {
    **{f"g2-standard-{n}": ("nvidia-l4", {24: 2, 48: 4, 96: 8}.get(n, 1)) for n in (4, 8, 12, 16, 24, 32, 48, 96)},
    **{f"a2-highgpu-{n}g": ("nvidia-tesla-a100", n) for n in (1, 2, 4, 8)},
    "a2-ultragpu-1g": ("nvidia-a100-80gb", 1), "a2-ultragpu-8g": ("nvidia-a100-80gb", 8),
    "a3-highgpu-8g": ("nvidia-h100-80gb", 8),
}  # fmt: skip
"""Accelerator-optimized types come with their GPUs (and their price includes them)."""
GPU_ON_DEMAND: dict[str, float] = {"nvidia-tesla-t4": 0.35, "nvidia-tesla-v100": 2.48, "nvidia-tesla-p4": 0.60}
GPU_SPOT: dict[str, float] = {"nvidia-tesla-t4": 0.14, "nvidia-tesla-v100": 0.99, "nvidia-tesla-p4": 0.24}
"""GPUs attached to an N1 VM, USD per GPU-hour in us-central1, as of ``AS_OF``."""
GPU_QUOTA: dict[str, str] = {
    "nvidia-l4": "NVIDIA_L4_GPUS", "nvidia-tesla-a100": "NVIDIA_A100_GPUS", "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS", "nvidia-tesla-t4": "NVIDIA_T4_GPUS", "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
}  # fmt: skip
"""The regional quota metric each GPU model draws from; spot VMs draw from ``PREEMPTIBLE_`` + it when the project has that."""
REGION_FACTOR: dict[str, float] = {
    "us-central1": 1.0, "us-east1": 1.0, "us-west1": 1.0, "us-east4": 1.126, "us-west4": 1.126,
    "europe-west1": 1.1, "europe-west4": 1.1, "europe-west3": 1.288,
    "asia-east1": 1.16, "asia-northeast1": 1.28, "asia-southeast1": 1.23,
}  # fmt: skip
"""A region's list prices over us-central1's (N1's ratios); GPU types differ by up to ~15%, and not every
type is offered in every region: the table does not know which."""

EGRESS_AS_OF = "2026-12"
EGRESS_PER_GB: dict[str, float] = {"inter_region": 0.05, "internet": 0.12}
"""USD per GB leaving a GCP region, premium tier: to another GCP region (one rate: GCP's between North
America and Europe; it errs high within a continent, $0.01-0.02/GB), or to the internet (another cloud;
the first TB a month). Within a region it is 0 here; GCP bills $0.01/GB between zones, not counted."""
_ASIA = {"inter_region": 0.08, "internet": 0.12}
_EGRESS_FROM: dict[str, dict[str, float]] = {
    "asia-east1": _ASIA, "asia-northeast1": {**_ASIA, "internet": 0.14}, "asia-southeast1": {**_ASIA, "internet": 0.14},
}  # fmt: skip
"""Source regions that charge more than ``EGRESS_PER_GB``: Asia's intercontinental rate; Tokyo and Singapore to the internet."""
MAX_DOLLARS_PER_HOUR = 1_000.0
"""No VM costs more an hour (a3-highgpu-8g lists near $88): a larger override is a mistake, not a price."""


def known_types() -> str:
    """The table's machine types, by family: what an "unknown type" warning says is known."""
    families: dict[str, list[str]] = {}
    for kind in ON_DEMAND:
        family, _, size = kind.rpartition("-")
        families.setdefault(family, []).append(size)
    return ", ".join(f"{family}-{'/'.join(sizes)}" for family, sizes in families.items())


Prices = tuple[float | None, float | None, str]
"""(spot, on-demand) USD per VM-hour, and why when either is None."""


def machine_prices(machine_type: str, region: str, accelerator: str = "", count: int = 1) -> Prices:
    """(spot, on-demand) USD per VM-hour from the tables, and why when either is None (pure; never guessed).

    An N1 type with ``accelerator`` costs the machine plus ``count`` GPUs; a type in ``BUILT_IN_GPUS``
    already includes its GPUs, so ``accelerator`` adds nothing."""
    factor = REGION_FACTOR.get(region)
    if machine_type not in ON_DEMAND:
        return None, None, f"ddctl's GCP table ({AS_OF}) has no machine type {machine_type!r}; it knows {known_types()}"
    if factor is None:
        return None, None, f"ddctl's GCP table ({AS_OF}) has no region {region!r}; it knows {', '.join(REGION_FACTOR)}"
    spot, on_demand = SPOT[machine_type], ON_DEMAND[machine_type]
    if accelerator and machine_type not in BUILT_IN_GPUS:
        if not machine_type.startswith("n1-") or accelerator not in GPU_ON_DEMAND:
            known = f"N1 types take {', '.join(GPU_ON_DEMAND)}"
            return None, None, f"ddctl's GCP table ({AS_OF}) has no {accelerator!r} on {machine_type} ({known})"
        spot, on_demand = spot + count * GPU_SPOT[accelerator], on_demand + count * GPU_ON_DEMAND[accelerator]
    return round(spot * factor, 4), round(on_demand * factor, 4), ""


def gpus(machine_type: str, accelerator: str = "", count: int = 1) -> tuple[str, int] | None:
    """The GPU model and how many a VM runs: a type's own, else the attached ones; None without GPUs."""
    return own_or_attached_gpus(BUILT_IN_GPUS, machine_type, accelerator, count)


def egress_per_gb(route: str, region: str) -> float | None:
    """USD per GB leaving ``region`` by ``route`` (``inter_region`` or ``internet``; anything else is free).

    None when the route is billed and the region is not in the table (rates differ by source)."""
    if route not in EGRESS_PER_GB:
        return 0.0
    return _EGRESS_FROM.get(region, EGRESS_PER_GB)[route] if region in REGION_FACTOR else None


def notes() -> list[str]:
    """What the GCP figures rest on, for the plan to show."""
    rates = ", ".join(f"${rate}/GB {route.replace('_', '-')}" for route, rate in EGRESS_PER_GB.items())
    return [
        f"gcp prices: list prices as of {AS_OF} shipped with ddctl (us-central1 x a regional factor; g2/a2/a3 include "
        "their GPUs, N1 adds attached ones); spot: us-central1's table x the same factor, though GCP sets spot per "
        "region and moves it up to monthly; a region's prices: in the regions file win",
        f"gcp egress as of {EGRESS_AS_OF}, premium tier: {rates} (Asia sources more); free within a region "
        "(zone to zone not counted)",
        "gcp GPU quotas are not checked offline: a plan with GPUs needs, in each region, its GPU model's quota "
        "(e.g. NVIDIA_L4_GPUS; spot VMs use PREEMPTIBLE_NVIDIA_L4_GPUS where granted) and GPUS_ALL_REGIONS over all; "
        "check with gcloud compute regions describe REGION and gcloud compute project-info describe",
    ]


def quote_regions(
    regions: Sequence[Region],
    counts: Mapping[str, int],
    leaving: Mapping[str, Mapping[str, float]],
    clients: object | None = None,
    on_demand_counts: Mapping[str, int] | None = None,
) -> dict[str, RegionQuote]:
    """Quote each GCP region of a plan: ``counts`` VMs each, ``leaving`` bytes per hour by route (no network).

    ``on_demand_counts``: of those, the VMs on demand whatever the region says (the syncer): their GPUs
    draw from the standard quota, spot ones from the preemptible. ``clients`` is AWS's shape; unused.
    GPU quotas are per cloud region: the needs of regions that share one are summed, the line goes to the first."""
    parts: dict[str, dict[str, Any]] = {}
    needs: dict[str, dict[tuple[str, bool], int]] = {}
    for region in regions:
        count = max(counts.get(region.name, 0), 0)
        fixed = min(max((on_demand_counts or {}).get(region.name, 0), 0), count)
        parts[region.name] = _quote_one(region, leaving.get(region.name, {}))
        chosen = region.types[0] if region.types else ""
        used = gpus(chosen, region.accelerator, region.accelerator_count) if chosen else None
        spot_n = count - fixed if region.spot else 0
        for spot, n in ((True, spot_n), (False, count - spot_n)):
            if used is not None and n > 0:
                bucket = needs.setdefault(region.cloud_region, {})
                bucket[(used[0], spot)] = bucket.get((used[0], spot), 0) + n * used[1]
    for where, needed in needs.items():
        first = next(r.name for r in regions if r.cloud_region == where)
        parts[first]["warnings"] += [_quota_line(where, model, spot, n) for (model, spot), n in sorted(needed.items())]
    return {name: RegionQuote(**{**p, "warnings": tuple(p["warnings"])}) for name, p in parts.items()}


def _quota_line(where: str, model: str, spot: bool, n: int) -> str:
    """What a plan needs of one GPU quota in one region, and how to check it (ddctl cannot, offline)."""
    check = f"(quota not checked offline: gcloud compute regions describe {where})"
    metric = GPU_QUOTA.get(model)
    if metric is None:
        return f"{where}: needs {n} {model} GPUs{' (spot)' if spot else ''}; ddctl knows no quota metric for it {check}"
    if spot:
        return f"{where}: needs {n} PREEMPTIBLE_{metric} for spot VMs, else {metric} {check}"
    return f"{where}: needs {n} {metric} {check}"


def _override(kind: str, table: float | None, value: float | None, where: str, warnings: list[str]) -> float | None:
    """The regions file's price over the table's, said in a warning; one that is no price is ignored, said too."""
    if value is None:
        return table
    if not (math.isfinite(value) and 0 <= value <= MAX_DOLLARS_PER_HOUR):
        warnings.append(f"{where}: prices.{kind.replace('-', '_')}_per_hour {value!r} is not a price; ignored")
        return table
    was = f"${table:.4f}/h" if table is not None else "unknown"
    warnings.append(f"{where}: {kind} ${value:.4f}/h set by the regions file (ddctl's {AS_OF} table: {was})")
    return value


def _quote_one(region: Region, out: Mapping[str, float]) -> dict[str, Any]:
    """One region's figures (RegionQuote's fields), from the tables and the regions file only."""
    where, types, warnings = region.cloud_region, region.types, []
    chosen = types[0] if types else ""
    if len(types) > 1:
        warnings.append(
            f"{where}: priced as {chosen}, the first of {', '.join(types)}: GCP has no spot market to read the "
            "cheapest from, and up tries them in order"
        )
    spot, on_demand, why = machine_prices(chosen, where, region.accelerator, region.accelerator_count)
    if not chosen:
        why = "no instance type given"
    own = BUILT_IN_GPUS.get(chosen)
    if own is not None and region.accelerator and (region.accelerator, region.accelerator_count) != own:
        warnings.append(
            f"{where}: {chosen} comes with {own[1]} {own[0]} (priced with them, once); the regions file says "
            f"{region.accelerator_count} {region.accelerator}: check which you mean"
        )
    override = region.prices
    spot = _override("spot", spot, override.spot_per_hour if override else None, where, warnings)
    on_demand = _override("on-demand", on_demand, override.on_demand_per_hour if override else None, where, warnings)
    missing = [label for label, value in (("spot", spot), ("on-demand", on_demand)) if value is None]
    if missing:
        warnings.append(f"{where}: {' and '.join(missing)} price unknown: {why}; the regions file's prices: can set it")
    if region.spot and region.price_cap is not None and spot is not None and spot > region.price_cap:
        warnings.append(
            f"{where}: the spot price ${spot:.4f}/h is above price_cap ${region.price_cap}/h: GCP spot takes no bid, "
            "so ddctl refuses to launch there: up would get none"
        )
    sane = {route: b for route, b in out.items() if math.isfinite(b) and b >= 0}
    if not math.isfinite(sum(sane.values())):  # finite bytes that sum past a float
        sane = {}
    rates = {route: egress_per_gb(route, where) for route in sane}
    egress: float | None = sum(b / GB * (rates[route] or 0.0) for route, b in sane.items())
    if len(sane) < len(out):
        egress = None
        warnings.append(f"{where}: egress unknown: bytes per hour {dict(out)!r} are not finite numbers >= 0 (with a finite sum)")
    elif any(rates[route] is None and b > 0 for route, b in sane.items()):
        egress = None
        warnings.append(f"{where}: egress unknown: ddctl's GCP egress table ({EGRESS_AS_OF}) has no region {where!r}")
    return {
        "instance_type": chosen,
        "zone": region.zones[0] if region.zones else "",
        "spot": region.spot,
        "spot_per_hour": spot,
        "on_demand_per_hour": on_demand,
        "vcpus": VCPUS.get(chosen),
        "egress_gb_per_hour": round(sum(sane.values()) / GB, 3),
        "egress_per_hour": None if egress is None else round(egress, 4),
        "warnings": warnings,
    }
