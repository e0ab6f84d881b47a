"""What ``up --plan`` says a GCP plan costs: dated tables x a regional factor, the file's overrides, egress, GPU quotas.

Nothing here needs the network: GCP figures come from tables shipped with ddctl. The tests hold the
quote to the tables (and a few figures written out, so a slip in the arithmetic cannot hide behind the
same slip in the test), and check the boundaries: unknown is None with a why, never a guess or a NaN.
"""

from __future__ import annotations

import math
import socket
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddctl import providers
from ddctl.config.regions import PriceOverride, Region, parse_regions
from ddctl.control.quotes import GB, RegionQuote, plan_cost, quote_plan
from ddctl.providers.gcp import prices
from ddctl.providers.gcp.prices import (
    BUILT_IN_GPUS,
    EGRESS_PER_GB,
    GPU_ON_DEMAND,
    GPU_SPOT,
    ON_DEMAND,
    REGION_FACTOR,
    SPOT,
    VCPUS,
)

TYPES = sorted(ON_DEMAND)
REGIONS = sorted(REGION_FACTOR)


def region(**fields: Any) -> Region:
    """A GCP region of a plan, defaults filled in."""
    return Region(**{"name": "r", "provider": "gcp", "cloud_region": "us-central1", **fields})


def quote(counts: int = 1, leaving: dict[str, float] | None = None, on_demand: int = 0, **fields: Any) -> RegionQuote:
    """One region's quote, ``counts`` VMs, ``on_demand`` of them on demand whatever the region says."""
    r = region(**fields)
    return prices.quote_regions([r], {r.name: counts}, {r.name: leaving or {}}, on_demand_counts={r.name: on_demand})[r.name]


def test_the_tables_agree_with_each_other() -> None:
    assert set(SPOT) == set(ON_DEMAND) == set(VCPUS)
    assert set(BUILT_IN_GPUS) <= set(ON_DEMAND) and set(GPU_SPOT) == set(GPU_ON_DEMAND)
    assert set(prices._EGRESS_FROM) <= set(REGION_FACTOR)
    assert {m for m, _ in BUILT_IN_GPUS.values()} | set(GPU_ON_DEMAND) <= set(prices.GPU_QUOTA)


@pytest.mark.parametrize("kind", TYPES)
def test_spot_is_cheaper_than_on_demand_for_every_entry(kind: str) -> None:
    assert 0 < SPOT[kind] < ON_DEMAND[kind] < prices.MAX_DOLLARS_PER_HOUR
    for gpu in GPU_SPOT:
        assert 0 < GPU_SPOT[gpu] < GPU_ON_DEMAND[gpu]


@pytest.mark.parametrize(
    ("kind", "where", "spot", "on_demand", "vcpus"),
    [  # written out: a change to a table or to the arithmetic must change this test too
        ("g2-standard-4", "us-central1", 0.2673, 0.7068, 4),
        ("g2-standard-8", "europe-west4", round(0.3110 * 1.1, 4), round(0.8536 * 1.1, 4), 8),
        ("a2-highgpu-1g", "us-east4", round(1.4694 * 1.126, 4), round(3.6734 * 1.126, 4), 12),
        ("a3-highgpu-8g", "us-central1", 22.9, 88.2539, 208),
        ("e2-standard-2", "asia-northeast1", round(0.0201 * 1.28, 4), round(0.067 * 1.28, 4), 2),
    ],
)
def test_a_known_type_is_quoted_from_the_table(kind: str, where: str, spot: float, on_demand: float, vcpus: int) -> None:
    q = quote(instance_type=kind, cloud_region=where, zones=(f"{where}-b", f"{where}-a"))
    assert (q.instance_type, q.zone, q.spot_per_hour, q.on_demand_per_hour, q.vcpus) == (
        kind,
        f"{where}-b",
        spot,
        on_demand,
        vcpus,
    )
    assert not [w for w in q.warnings if "unknown" in w]


@given(kind=st.sampled_from(TYPES), where=st.sampled_from(REGIONS), spot=st.booleans())
def test_every_type_in_every_region_is_table_times_factor(kind: str, where: str, spot: bool) -> None:
    q = quote(instance_type=kind, cloud_region=where, spot=spot)
    factor = REGION_FACTOR[where]
    assert q.spot_per_hour == round(SPOT[kind] * factor, 4) and q.on_demand_per_hour == round(ON_DEMAND[kind] * factor, 4)
    assert q.spot_per_hour < q.on_demand_per_hour and q.per_hour == (q.spot_per_hour if spot else q.on_demand_per_hour)
    assert q.vcpus == VCPUS[kind] and q.zone == ""


def test_vcpus_come_from_the_machine_type() -> None:
    assert (VCPUS["g2-standard-8"], VCPUS["a2-highgpu-1g"], VCPUS["a2-ultragpu-8g"], VCPUS["a3-highgpu-8g"]) == (8, 12, 96, 208)
    assert (VCPUS["n1-standard-16"], VCPUS["e2-standard-2"], VCPUS["n2-standard-8"]) == (16, 2, 8)


def test_an_n1_machine_adds_its_attached_gpus() -> None:
    bare = quote(instance_type="n1-standard-8", cloud_region="europe-west1")
    two_t4 = quote(instance_type="n1-standard-8", cloud_region="europe-west1", accelerator="nvidia-tesla-t4", accelerator_count=2)
    assert two_t4.on_demand_per_hour == round((0.38 + 2 * 0.35) * 1.1, 4)
    assert two_t4.spot_per_hour == round((0.08 + 2 * 0.14) * 1.1, 4)
    assert bare.on_demand_per_hour is not None and two_t4.on_demand_per_hour > bare.on_demand_per_hour
    assert two_t4.vcpus == 8


@given(
    kind=st.sampled_from([t for t in TYPES if t.startswith("n1-")]),
    gpu=st.sampled_from(sorted(GPU_ON_DEMAND)),
    count=st.integers(1, 16),
    where=st.sampled_from(REGIONS),
)
def test_n1_costs_machine_plus_count_gpus(kind: str, gpu: str, count: int, where: str) -> None:
    spot, on_demand, why = prices.machine_prices(kind, where, gpu, count)
    factor = REGION_FACTOR[where]
    assert on_demand == round((ON_DEMAND[kind] + count * GPU_ON_DEMAND[gpu]) * factor, 4)
    assert spot == round((SPOT[kind] + count * GPU_SPOT[gpu]) * factor, 4) and spot < on_demand and why == ""


@pytest.mark.parametrize("kind", sorted(BUILT_IN_GPUS))
def test_a_gpu_type_with_its_accelerator_set_is_not_counted_twice(kind: str) -> None:
    model, count = BUILT_IN_GPUS[kind]
    plain = quote(instance_type=kind)
    with_gpu = quote(instance_type=kind, accelerator=model, accelerator_count=count)
    assert (with_gpu.spot_per_hour, with_gpu.on_demand_per_hour) == (plain.spot_per_hour, plain.on_demand_per_hour)
    assert (plain.spot_per_hour, plain.on_demand_per_hour) == (SPOT[kind], ON_DEMAND[kind])
    assert not [w for w in with_gpu.warnings if "comes with" in w]


def test_a_gpu_type_with_another_accelerator_says_what_it_comes_with() -> None:
    q = quote(instance_type="g2-standard-24", accelerator="nvidia-tesla-t4")
    assert q.on_demand_per_hour == ON_DEMAND["g2-standard-24"]
    assert any("g2-standard-24 comes with 2 nvidia-l4" in w and "1 nvidia-tesla-t4" in w for w in q.warnings)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"instance_type": "g3-standard-4"}, "'g3-standard-4'"),
        ({"instance_type": "g2-standard-4", "cloud_region": "mars-central1"}, "'mars-central1'"),
        ({"instance_type": "n1-standard-4", "accelerator": "nvidia-l4"}, "'nvidia-l4' on n1-standard-4"),
        ({"instance_type": "e2-standard-4", "accelerator": "nvidia-tesla-t4"}, "'nvidia-tesla-t4' on e2-standard-4"),
        ({}, "no instance type given"),
    ],
)
def test_an_unknown_type_or_region_is_none_with_a_warning_naming_it(fields: dict[str, Any], named: str) -> None:
    r = region(name="odd", **fields)
    q = prices.quote_regions([r], {"odd": 2}, {"odd": {}})["odd"]
    assert q.spot_per_hour is None and q.on_demand_per_hour is None and q.per_hour is None
    [why] = [w for w in q.warnings if "price unknown" in w]
    assert named in why and "spot and on-demand" in why
    if "instance_type" in fields and "accelerator" not in fields:  # it says what it knows instead
        assert ("g2-standard-4/8/12" in why) if "g3" in named else ("us-central1" in why and "asia-east1" in why)
    known = region(name="ok", instance_type="g2-standard-4")
    both = {"odd": q, "ok": prices.quote_regions([known], {"ok": 1}, {"ok": {}})["ok"]}
    cost = plan_cost(both, {"odd": 2, "ok": 1})
    assert cost.unknown == ("odd",) and cost.per_hour == SPOT["g2-standard-4"]


def test_overrides_win_over_the_table_and_say_so() -> None:
    q = quote(instance_type="g2-standard-8", prices={"spot_per_hour": 0.25, "on_demand_per_hour": 0.9})
    assert (q.spot_per_hour, q.on_demand_per_hour) == (0.25, 0.9)
    spot, on_demand = (w for w in q.warnings if "set by the regions file" in w)
    assert "spot $0.2500/h" in spot and f"table: ${SPOT['g2-standard-8']:.4f}/h" in spot and prices.AS_OF in spot
    assert "on-demand $0.9000/h" in on_demand and f"table: ${ON_DEMAND['g2-standard-8']:.4f}/h" in on_demand


def test_an_override_prices_a_type_the_table_lacks_and_only_the_missing_figure_is_unknown() -> None:
    rf = parse_regions(
        {
            "syncer": "iowa",
            "regions": [
                {
                    "name": "iowa",
                    "provider": "gcp",
                    "cloud_region": "us-central1",
                    "instance_type": "g4-standard-48",
                    "prices": {"spot_per_hour": 1.5},
                }
            ],
        },
        Path("x.yaml"),
    )
    q = prices.quote_regions(rf.regions, {"iowa": 2}, {"iowa": {}})["iowa"]
    assert q.spot_per_hour == 1.5 and q.on_demand_per_hour is None and q.vcpus is None
    assert any("spot $1.5000/h set by the regions file (ddctl's" in w and "table: unknown" in w for w in q.warnings)
    [why] = [w for w in q.warnings if "price unknown" in w]
    assert why.startswith("us-central1: on-demand price unknown") and "'g4-standard-48'" in why
    assert plan_cost({"iowa": q}, {"iowa": 2}).unknown == ("iowa",)  # on demand for comparison is unknown


@given(value=st.floats(allow_nan=True, allow_infinity=True) | st.floats(0, 2_000))
def test_an_override_is_never_a_nan_or_an_infinity(value: float) -> None:
    override = PriceOverride.model_construct(spot_per_hour=value, on_demand_per_hour=value)  # past the model's checks
    r = region(instance_type="g2-standard-4").model_copy(update={"prices": override})
    got = prices.quote_regions([r], {"r": 1}, {"r": {}})["r"]
    for figure in (got.spot_per_hour, got.on_demand_per_hour):
        assert figure is not None and math.isfinite(figure) and 0 <= figure <= prices.MAX_DOLLARS_PER_HOUR
    sane = math.isfinite(value) and 0 <= value <= prices.MAX_DOLLARS_PER_HOUR
    assert got.spot_per_hour == (value if sane else SPOT["g2-standard-4"])
    assert any(("not a price; ignored" in w) != sane for w in got.warnings)


@pytest.mark.parametrize("route", ["inter_region", "internet", "same_region", "carrier_pigeon"])
@pytest.mark.parametrize("where", REGIONS)
def test_egress_per_hour_is_bytes_over_gb_times_the_rate(route: str, where: str) -> None:
    rate = prices.egress_per_gb(route, where)
    assert rate == (prices._EGRESS_FROM.get(where, EGRESS_PER_GB)[route] if route in EGRESS_PER_GB else 0.0)
    q = quote(instance_type="g2-standard-4", cloud_region=where, leaving={route: 7.3e9})
    assert q.egress_gb_per_hour == 7.3 and q.egress_per_hour == round(7.3e9 / GB * rate, 4)


def test_egress_rates_written_out() -> None:
    assert prices.egress_per_gb("internet", "us-central1") == 0.12 and prices.egress_per_gb("internet", "asia-northeast1") == 0.14
    assert (
        prices.egress_per_gb("inter_region", "europe-west4") == 0.05
        and prices.egress_per_gb("inter_region", "asia-east1") == 0.08
    )
    assert (
        prices.egress_per_gb("internet", "mars-central1") is None and prices.egress_per_gb("same_region", "mars-central1") == 0.0
    )


@given(
    out=st.dictionaries(st.sampled_from(["inter_region", "internet", "same_region"]), st.floats(0, 1e15), max_size=3),
    where=st.sampled_from(REGIONS),
)
def test_egress_sums_its_routes(out: dict[str, float], where: str) -> None:
    q = quote(instance_type="g2-standard-4", cloud_region=where, leaving=out)
    expected = sum(b / GB * (prices.egress_per_gb(route, where) or 0.0) for route, b in out.items())
    assert q.egress_per_hour == round(expected, 4) and q.egress_gb_per_hour == round(sum(out.values()) / GB, 3)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_bytes_that_are_no_number_leave_egress_unknown_not_nan(bad: float) -> None:
    q = quote(instance_type="g2-standard-4", leaving={"internet": bad, "inter_region": 1e9})
    assert q.egress_per_hour is None and math.isfinite(q.egress_gb_per_hour)
    assert any("egress unknown" in w for w in q.warnings)
    assert quote(instance_type="g2-standard-4", cloud_region="mars-1", leaving={"internet": 1e9}).egress_per_hour is None
    huge = quote(instance_type="g2-standard-4", leaving={"internet": 1.7e308, "inter_region": 1.7e308})  # sums to inf
    assert huge.egress_per_hour is None and math.isfinite(huge.egress_gb_per_hour)


def quota_lines(q: RegionQuote) -> list[str]:
    return [w for w in q.warnings if "quota not checked offline" in w]


@pytest.mark.parametrize(
    ("fields", "count", "on_demand", "expected"),
    [
        ({"instance_type": "g2-standard-4"}, 3, 1, ["needs 1 NVIDIA_L4_GPUS ", "needs 2 PREEMPTIBLE_NVIDIA_L4_GPUS for spot"]),
        ({"instance_type": "g2-standard-4"}, 3, 0, ["needs 3 PREEMPTIBLE_NVIDIA_L4_GPUS"]),
        ({"instance_type": "g2-standard-48", "spot": False}, 2, 0, ["needs 8 NVIDIA_L4_GPUS "]),
        ({"instance_type": "a3-highgpu-8g"}, 1, 1, ["needs 8 NVIDIA_H100_GPUS "]),
        (
            {"instance_type": "n1-standard-4", "accelerator": "nvidia-tesla-t4", "accelerator_count": 2},
            2,
            0,
            ["needs 4 PREEMPTIBLE_NVIDIA_T4"],
        ),
        ({"instance_type": "n1-standard-4"}, 2, 0, []),
        ({"instance_type": "g2-standard-4"}, 0, 0, []),
    ],
)
def test_counts_and_on_demand_counts_decide_the_gpu_quota_lines(
    fields: dict[str, Any], count: int, on_demand: int, expected: list[str]
) -> None:
    lines = quota_lines(quote(counts=count, on_demand=on_demand, **fields))
    assert len(lines) == len(expected)
    for line, needle in zip(lines, expected, strict=True):
        assert line.startswith("us-central1: ") and needle in line and "gcloud compute regions describe us-central1" in line


def test_regions_that_share_a_cloud_region_sum_their_gpus_on_the_first() -> None:
    a = region(name="a", instance_type="g2-standard-4")
    b = region(name="b", instance_type="g2-standard-24")
    c = region(name="c", instance_type="g2-standard-4", cloud_region="us-east1")
    quotes = prices.quote_regions([a, b, c], {"a": 2, "b": 1, "c": 1}, {}, on_demand_counts={})
    assert [line.split(" (")[0] for line in quota_lines(quotes["a"])] == [
        "us-central1: needs 4 PREEMPTIBLE_NVIDIA_L4_GPUS for spot VMs, else NVIDIA_L4_GPUS"
    ]
    assert quota_lines(quotes["b"]) == [] and len(quota_lines(quotes["c"])) == 1


def test_more_than_one_type_prices_the_first_and_says_up_tries_them_in_order() -> None:
    q = quote(instance_types=("g2-standard-8", "g2-standard-4"), zones=("us-central1-c", "us-central1-a"))
    assert (q.instance_type, q.zone, q.spot_per_hour) == ("g2-standard-8", "us-central1-c", SPOT["g2-standard-8"])
    assert any("up tries them in order" in w and "no spot market" in w for w in q.warnings)
    assert not any("in order" in w for w in quote(instance_type="g2-standard-8").warnings)


@pytest.mark.parametrize(("cap", "spot", "warned"), [(0.2, True, True), (0.3, True, False), (0.2, False, False)])
def test_a_price_cap_below_the_spot_price_means_ddctl_launches_none(cap: float, spot: bool, warned: bool) -> None:
    q = quote(instance_type="g2-standard-4", price_cap=cap, spot=spot)  # spot $0.2673
    assert any("above price_cap" in w and "no bid" in w and "up would get none" in w for w in q.warnings) == warned


def test_notes_carry_the_dates_and_the_quota_command() -> None:
    text = "\n".join(prices.notes())
    assert prices.AS_OF.startswith("20") and prices.EGRESS_AS_OF.startswith("20")
    assert f"as of {prices.AS_OF}" in text and f"as of {prices.EGRESS_AS_OF}" in text
    assert "GPUS_ALL_REGIONS" in text and "gcloud compute regions describe REGION" in text
    source = Path(prices.__file__).read_text()  # the tables' docstrings: where the figures came from
    assert "check before you trust a cent" in source and "list prices" in source
    assert "cloud.google.com/compute/vm-instance-pricing" in source and "cloud.google.com/spot-vms/pricing" in source


def test_quote_plan_prices_a_gcp_plan_without_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``control/quotes.py`` as ``up --plan`` calls it; any socket opened fails the test."""
    monkeypatch.setitem(providers.KINDS, "gcp", providers.Kind("gcp", "x:Y", local=False, prices="ddctl.providers.gcp.prices"))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a GCP quote opened a socket")

    monkeypatch.setattr(socket, "socket", refuse)
    raw = {
        "syncer": "iowa",
        "regions": [
            {"name": "iowa", "provider": "gcp", "cloud_region": "us-central1", "instance_type": "g2-standard-8", "learners": 2},
            {"name": "belgium", "provider": "gcp", "cloud_region": "europe-west1", "instance_type": "g2-standard-8"},
        ],
    }
    rf = parse_regions(raw, Path("x.yaml"))
    planned = quote_plan(rf, {r.name: r.provider for r in rf.regions})
    assert set(planned.regions) == {"iowa", "belgium"}
    assert planned.regions["belgium"].on_demand_per_hour == round(ON_DEMAND["g2-standard-8"] * 1.1, 4)
    assert planned.regions["belgium"].egress_per_hour and planned.regions["iowa"].egress_per_hour
    assert any(prices.AS_OF in n for n in planned.notes)
    assert any("NVIDIA_L4_GPUS" in w for w in planned.regions["iowa"].warnings)
