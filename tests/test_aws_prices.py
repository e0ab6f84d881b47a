"""What ``up --plan`` says an AWS plan costs: spot from EC2's history, on-demand from the table, quotas, egress.

boto3 talks to moto behind the test cloud's fault layer (``tests/aws_cloud.py``). moto answers
``DescribeSpotPriceHistory`` with one constant price dated 2006, so spot prices here are canned
EC2 answers (XML, paged with ``nextToken``) given through the fault layer: the real request goes out
and botocore parses a real response; only the figures are ours. moto knows no EC2 quota codes, so
quota values are canned too (``answer_quota``), and without one the preflight must say it could not tell.
The egress figure is checked against what it claims to measure: frames the real codec makes from
an outer gradient of the preset's real model.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from aws_cloud import AwsCloud
from ddctl import providers
from ddctl.cli.app import app
from ddctl.config.regions import job_config, parse_regions
from ddctl.control.quotes import RegionQuote, egress_bytes, model_tensors, payload_bytes, plan_cost, sync_traffic
from ddctl.providers.aws import prices
from ddctl.providers.aws.clients import Clients
from ddctl.providers.aws.prices import ON_DEMAND_QUOTAS, SPOT_QUOTAS
from ddctl_agents.core import codec
from ddctl_agents.core.choices import DELTA
from ddctl_agents.core.fragments import TensorSpec, fragment_tensors
from ddctl_agents.core.messages import FragmentVersion, Update, encode_update
from ddctl_agents.core.version_delta import coder
from ddctl_agents.train.model import GPT, build_model
from ddctl_agents.train.presets import PRESETS, get_preset

EXAMPLE = Path(__file__).parent.parent / "docs" / "examples" / "aws.yaml"
G = SPOT_QUOTAS["g"]


def history(items: list[tuple[str, str, float | str, str]], next_token: str = "") -> str:
    """An EC2 DescribeSpotPriceHistory answer of (type, zone, price, timestamp) items."""

    def text(p: float | str) -> str:
        return p if isinstance(p, str) else f"{p:.6f}"

    rows = "".join(
        f"<item><instanceType>{t}</instanceType><productDescription>Linux/UNIX</productDescription>"
        f"<spotPrice>{text(p)}</spotPrice><timestamp>{ts}</timestamp><availabilityZone>{z}</availabilityZone></item>"
        for t, z, p, ts in items
    )
    token = f"<nextToken>{next_token}</nextToken>" if next_token else ""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>{uuid.uuid4()}</requestId><spotPriceHistorySet>{rows}</spotPriceHistorySet>{token}"
        "</DescribeSpotPriceHistoryResponse>"
    )


NOW = "2026-06-01T12:00:00.000Z"
EARLIER = "2026-06-01T09:00:00.000Z"
US_EAST = [  # page 1, then page 2
    [
        ("g6.xlarge", "us-east-1a", 0.4012, NOW),
        ("g6.xlarge", "us-east-1b", 0.2000, EARLIER),  # superseded by the newer price below
        ("g6.xlarge", "us-east-1b", 0.3500, NOW),
        ("g6.xlarge", "us-east-1d", 0.1000, NOW),  # cheapest, but not an allowed zone
    ],
    [("g5.xlarge", "us-east-1a", 0.3300, NOW), ("g5.xlarge", "us-east-1b", 0.3900, NOW)],
]


def answer_spot(cloud: AwsCloud, region: str, pages: list[list[tuple[str, str, float | str, str]]]) -> None:
    """Canned pages: the first for the first call, page i for the call that carries token ``p{i}``."""
    cloud.answer("DescribeSpotPriceHistory", history(pages[0], "p1" if len(pages) > 1 else ""), region=region)
    for i, page in enumerate(pages[1:], start=1):
        token = f"p{i + 1}" if i + 1 < len(pages) else ""
        cloud.answer("DescribeSpotPriceHistory", history(page, token), region=region, match={"NextToken": f"p{i}"})


def test_the_cheapest_allowed_zone_over_the_preference_list_across_pages(aws: AwsCloud) -> None:
    answer_spot(aws, "us-east-1", US_EAST)
    ec2 = Clients().client("ec2", "us-east-1")
    quote = prices.spot_quote(ec2, ["g6.xlarge", "g5.xlarge"], ["us-east-1a", "us-east-1b"])
    assert quote == prices.SpotQuote(instance_type="g5.xlarge", zone="us-east-1a", price=0.33)
    first, second = aws.calls("DescribeSpotPriceHistory")
    assert first.params["InstanceType.1"] == "g6.xlarge" and first.params["InstanceType.2"] == "g5.xlarge"
    assert first.params["ProductDescription.1"] == "Linux/UNIX" and first.params["StartTime"].startswith("20")
    assert first.params["Filter.1.Name"] == "availability-zone" and first.params["Filter.1.Value.2"] == "us-east-1b"
    assert second.params["NextToken"] == "p1"
    anywhere = prices.spot_quote(ec2, ["g6.xlarge", "g5.xlarge"], [])  # no zones given: any zone of the region
    assert anywhere == prices.SpotQuote(instance_type="g6.xlarge", zone="us-east-1d", price=0.1)


def test_a_tie_goes_to_the_preferred_type_then_the_first_zone() -> None:
    offers = {(t, z): 0.5 for t in ("b", "a") for z in ("z2", "z1")}
    assert prices.cheapest(offers, ["a", "b"]) == prices.SpotQuote(instance_type="a", zone="z1", price=0.5)


def test_unknown_types_and_regions_are_none_never_invented(aws: AwsCloud) -> None:
    assert prices.spot_quote(Clients().client("ec2", "us-east-1"), ["zz9.huge"], []) is None  # moto: no offers
    assert prices.on_demand_price("zz9.huge", "us-east-1") is None
    assert prices.on_demand_price("g6.xlarge", "sa-east-1") is None
    assert prices.on_demand_price("g6.xlarge", "us-east-1") == 0.8048
    assert prices.on_demand_price("g6.xlarge", "eu-west-1") == round(0.8048 * 1.12, 4)
    assert prices.quota_for("u-6tb1.metal", spot=True) is None and prices.quota_for("p6-b200.48xlarge", spot=True) is None


def test_a_gpu_type_comes_with_its_gpus_and_any_other_with_what_the_file_names() -> None:
    assert prices.gpus("g5.12xlarge") == ("nvidia-a10g", 4) and prices.gpus("g5.16xlarge") == ("nvidia-a10g", 1)
    assert prices.gpus("g4dn.metal") == ("nvidia-t4", 8) and prices.gpus("g6e.48xlarge") == ("nvidia-l40s", 8)
    assert prices.gpus("p4de.24xlarge") == ("nvidia-a100-80gb", 8) and prices.gpus("p5e.48xlarge") == ("nvidia-h200", 8)
    assert prices.gpus("g6.xlarge", "nvidia-l4", 4) == ("nvidia-l4", 1)  # the type's own win over the file's
    assert prices.gpus("m7i.large") is None and prices.gpus("m7i.large", "nvidia-l4", 2) == ("nvidia-l4", 2)


def test_the_gpu_table_is_what_ec2_describes(aws: AwsCloud) -> None:
    """moto answers DescribeInstanceTypes from a copy of EC2's: every type's GPUs there are the table's."""
    pages = Clients().client("ec2", "us-east-1").get_paginator("describe_instance_types")
    described = {
        t["InstanceType"]: t["GpuInfo"]["Gpus"]
        for page in pages.paginate(InstanceTypes=sorted(prices.BUILT_IN_GPUS))
        for t in page["InstanceTypes"]
    }
    assert set(described) == set(prices.BUILT_IN_GPUS)
    for kind, (model, count) in prices.BUILT_IN_GPUS.items():
        (gpu,) = described[kind]
        name = f"nvidia-{gpu['Name'].lower()}"
        assert (gpu["Manufacturer"], gpu["Count"]) == ("NVIDIA", count), kind
        assert model in (name, f"{name}-{gpu['MemoryInfo']['SizeInMiB'] // 1024}gb"), kind


@pytest.mark.parametrize(
    ("instance_type", "spot_code", "on_demand_code"),
    [
        ("g6.xlarge", "L-3819A6DF", "L-DB2E81BA"),
        ("g4dn.12xlarge", "L-3819A6DF", "L-DB2E81BA"),
        ("p4d.24xlarge", "L-7212CCBC", "L-417A185B"),
        ("p5.48xlarge", "L-C4BD4855", "L-417A185B"),
        ("c7i.large", "L-34B43A08", "L-1216C47A"),
        ("t3.medium", "L-34B43A08", "L-1216C47A"),
        ("inf2.xlarge", "L-B5D1601B", "L-1945791B"),
        ("dl1.24xlarge", "L-85EED4F7", "L-6E869C2A"),
    ],
)
def test_each_family_draws_from_its_quota(instance_type: str, spot_code: str, on_demand_code: str) -> None:
    assert prices.quota_for(instance_type, spot=True).code == spot_code  # type: ignore[union-attr]
    assert prices.quota_for(instance_type, spot=False).code == on_demand_code  # type: ignore[union-attr]


def test_a_quota_shortfall_warns_with_the_code_the_numbers_and_the_fix(aws: AwsCloud) -> None:
    sq = Clients().client("service-quotas", "us-east-1")
    aws.answer_quota("L-3819A6DF", 8, region="us-east-1")
    [warning] = prices.quota_warnings(sq, "us-east-1", {G: 12})
    assert "L-3819A6DF" in warning and "All G and VT Spot Instance Requests" in warning
    assert "is 8 vCPUs, the plan needs 12" in warning
    assert (
        "request-service-quota-increase --region us-east-1 --service-code ec2 --quota-code L-3819A6DF --desired-value 12"
        in warning
    )
    assert prices.quota_warnings(sq, "us-east-1", {G: 8}) == []  # exactly enough
    aws.answer_quota("L-3819A6DF", 0, region="us-east-1")
    [zero] = prices.quota_warnings(sq, "us-east-1", {G: 4})
    assert "is 0 vCPUs, the plan needs 4" in zero


def test_the_on_demand_syncer_draws_on_the_on_demand_quota_its_spot_learners_on_the_spot_one(aws: AwsCloud) -> None:
    region = parse_regions(
        {"syncer": "v", "regions": [{"name": "v", "provider": "aws", "cloud_region": "us-east-1", "instance_type": "g5.xlarge"}]},
        Path("f.yaml"),
    ).regions[0]
    aws.answer_quota(G.code, 8, region="us-east-1")  # exactly the two spot learners' 8 vCPUs
    aws.answer_quota(ON_DEMAND_QUOTAS["g"].code, 0, region="us-east-1")  # none for the syncer
    [quote] = prices.quote_regions([region], {"v": 3}, {}, on_demand_counts={"v": 1}).values()
    [warning] = [w for w in quote.warnings if "quota" in w]
    assert ON_DEMAND_QUOTAS["g"].code in warning and "is 0 vCPUs, the plan needs 4" in warning


def test_a_quota_that_cannot_be_read_is_a_warning_not_a_pass(aws: AwsCloud) -> None:
    sq = Clients().client("service-quotas", "eu-west-1")
    [unknown] = prices.quota_warnings(sq, "eu-west-1", {G: 4})  # moto knows no EC2 quota codes
    assert unknown.startswith("eu-west-1: could not check quota L-3819A6DF") and "NoSuchResourceException" in unknown
    aws.fail("GetServiceQuota", "AccessDeniedException", message="not authorized to GetServiceQuota")
    [denied] = prices.quota_warnings(sq, "eu-west-1", {G: 4})
    assert "could not check quota L-3819A6DF" in denied and "AccessDeniedException" in denied and "needs 4 vCPUs" in denied


def plan_file(tmp_path: Path, **changes: Any) -> Any:
    raw = yaml.safe_load(EXAMPLE.read_text())
    for i, region in enumerate(changes.pop("regions", [])):
        raw["regions"][i] |= region
    return parse_regions(raw | changes, tmp_path / "aws.yaml")


def test_regions_are_quoted_with_type_zone_prices_vcpus_egress_and_quota(aws: AwsCloud, tmp_path: Path) -> None:
    rf = plan_file(tmp_path, regions=[{}, {"price_cap": 0.2}])
    answer_spot(aws, "us-east-1", US_EAST)
    answer_spot(aws, "eu-west-1", [[("g6.xlarge", "eu-west-1b", 0.31, NOW), ("g5.xlarge", "eu-west-1a", 0.52, NOW)]])
    aws.answer_quota("L-3819A6DF", 8, region="us-east-1")  # virginia needs 3 x 4 (syncer + 2 learners)
    aws.answer_quota("L-3819A6DF", 64, region="eu-west-1")
    leaving = {"virginia": {"inter_region": 6.5e9}, "ireland": {"inter_region": 1.7e9}}
    quotes = prices.quote_regions(rf.regions, {"virginia": 3, "ireland": 2}, leaving)
    virginia, ireland = quotes["virginia"], quotes["ireland"]
    assert (virginia.instance_type, virginia.zone, virginia.spot_per_hour, virginia.on_demand_per_hour) == (
        "g5.xlarge",
        "us-east-1a",
        0.33,
        1.006,
    )
    assert virginia.vcpus == 4 and virginia.egress_gb_per_hour == 6.5 and virginia.egress_per_hour == 0.13
    first, quota = virginia.warnings
    assert first.startswith("us-east-1: up tries g6.xlarge in us-east-1a first ($0.4012/h); the cheapest is g5.xlarge")
    assert "L-3819A6DF" in quota and "is 8 vCPUs, the plan needs 12" in quota
    assert (ireland.instance_type, ireland.zone, ireland.on_demand_per_hour) == (
        "g6.xlarge",
        "eu-west-1b",
        round(0.8048 * 1.12, 4),
    )
    [cap] = ireland.warnings  # its quota suffices; its price cap does not
    assert "above price_cap $0.2/h" in cap


def test_a_refused_price_read_is_a_warning_and_an_unknown_not_a_crash(aws: AwsCloud, tmp_path: Path) -> None:
    rf = plan_file(tmp_path)
    aws.fail("DescribeSpotPriceHistory", "UnauthorizedOperation", region="eu-west-1")
    aws.answer_quota("L-3819A6DF", 64)
    quotes = prices.quote_regions(rf.regions[1:], {"ireland": 2}, {})
    ireland = quotes["ireland"]
    assert (ireland.instance_type, ireland.spot_per_hour, ireland.per_hour, ireland.on_demand_per_hour) == (
        "g6.xlarge",  # the first preference, priced on demand from the table
        None,
        None,
        round(0.8048 * 1.12, 4),
    )
    [warning] = ireland.warnings
    assert warning.startswith("could not read spot prices: aws in eu-west-1: UnauthorizedOperation: You are not authorized")
    assert warning.endswith("(credentials: profile 'default')")  # which credentials were refused
    assert plan_cost(quotes, {"ireland": 2}).unknown == ("ireland",)


def test_sizes_mirror_the_real_model_and_the_real_codec() -> None:
    for name, config in PRESETS.items():
        with torch.device("meta"):
            real = [(n, p.numel()) for n, p in GPT(config).named_parameters()]
        assert model_tensors(config) == real, name
    for name in codec.CODECS:
        for n in (1, 7, 128, 129, 1000, 65_537):
            assert payload_bytes(name, n, 128) == codec.encoded_nbytes(name, n, 128), (name, n)


@pytest.mark.parametrize(
    ("preset", "fragments", "codec_up", "down"),
    [("tiny", 24, "int4", "bf16"), ("small", 8, "int4", "bf16"), ("tiny-moe", 6, "int8", "bf16"), ("tiny", 24, "int4", DELTA)],
)
def test_bytes_per_sync_match_the_frames_the_codec_makes(preset: str, fragments: int, codec_up: str, down: str) -> None:
    """Encode a real outer gradient of the preset's model, fragment by fragment, as learners send it; versions as
    the syncer sends them (int8-delta: a step from the version before, its steady state)."""
    job = job_config(parse_regions(_local(preset, fragments, codec_up, down), Path("x.yaml")))
    model = build_model(get_preset(preset), seed=0)
    params = dict(model.named_parameters())
    layout = fragment_tensors([TensorSpec(name=n, shape=tuple(p.shape)) for n, p in params.items()], fragments)
    generator = torch.Generator().manual_seed(0)
    up = down_bytes = 0
    for p, fragment in enumerate(layout.fragments):
        delta = {t.name: torch.randn(t.shape, generator=generator) * 1e-3 for t in fragment}  # an outer gradient
        meta: dict[str, Any] = {"step": 4_321, "c_steps": 24, "c_tokens": 24_576, "step_time": 0.75, "vclock": {"s0": 41}}
        update = Update(learner="L3", fragment=p, base_version=41, update_id=uuid.uuid4().hex, tensors=delta, **meta)
        up += len(encode_update(update, job.sync.codec, job.sync.block))
        version = FragmentVersion(fragment=p, version=42, tensors={t.name: params[t.name].detach() for t in fragment})
        versions = coder(job.down_codec, job.sync.block)
        versions.code(replace(version, version=41, tensors={n: t - delta[n] for n, t in version.tensors.items()}))
        down_bytes += len(versions.code(version).sent(41, rounded=False)[0])
    traffic = sync_traffic(job)
    assert traffic.up_bytes == pytest.approx(up, rel=0.01) and traffic.down_bytes == pytest.approx(down_bytes, rel=0.01)


def _local(preset: str, fragments: int, codec_up: str, down: str = "bf16") -> dict[str, Any]:
    training = {"preset": preset, "fragments": fragments, "inner_steps": 24, "codec": codec_up, "down_codec": down}
    return {"syncer": "a", "training": training, "regions": [{"name": "a", "provider": "process"}]}


def test_egress_leaves_the_region_that_sends_it_at_its_route(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["regions"] += [
        {"name": "virginia-b", "provider": "aws", "cloud_region": "us-east-1", "learners": 1, "instance_type": "g6.xlarge"},
        {"name": "iowa", "provider": "gcp", "cloud_region": "us-central1", "learners": 1, "instance_type": "g2-standard-4"},
    ]
    rf = parse_regions(raw, tmp_path / "aws.yaml")
    kinds = {r.name: r.provider for r in rf.regions}
    traffic = sync_traffic(job_config(rf), step_s=2.0)
    assert traffic.syncs_per_hour == 3600 / (24 * 2.0)
    out = egress_bytes(rf, kinds, traffic)
    per = traffic.syncs_per_hour
    assert out["ireland"] == {"inter_region": 2 * traffic.up_bytes * per}  # its learners' uploads
    assert out["virginia-b"] == {}  # the syncer's own cloud region: nothing leaves it
    assert out["iowa"] == {"internet": traffic.up_bytes * per}  # another cloud
    assert out["virginia"] == {"inter_region": 2 * traffic.down_bytes * per, "internet": traffic.down_bytes * per}
    dry = egress_bytes(rf, dict.fromkeys(kinds, "process"), traffic)  # a dry run: everything on this machine
    assert all(v == {} for v in dry.values())


def test_the_plan_totals() -> None:
    def quote(spot: bool, s: float | None, od: float | None, egress: float | None) -> RegionQuote:
        return RegionQuote(
            instance_type="t",
            zone="z",
            spot=spot,
            spot_per_hour=s,
            on_demand_per_hour=od,
            vcpus=4,
            egress_gb_per_hour=1.0,
            egress_per_hour=egress,
        )

    quotes = {"a": quote(True, 0.3, 0.8, 0.13), "b": quote(False, 0.25, 1.0, 0.035), "c": quote(True, None, 2.0, 0.0)}
    cost = plan_cost(quotes, {"a": 3, "b": 2, "c": 1})
    assert cost.per_hour == round(3 * 0.3 + 2 * 1.0, 4)  # b runs on demand; c's spot price is unknown, left out
    assert cost.on_demand_per_hour == round(3 * 0.8 + 2 * 1.0 + 2.0, 4)
    with_syncer = plan_cost(quotes, {"a": 3, "b": 2, "c": 1}, {"a": 1})  # a's syncer runs on demand in a spot region
    assert with_syncer.per_hour == round(2 * 0.3 + 0.8 + 2 * 1.0, 4) and with_syncer.on_demand_per_hour == cost.on_demand_per_hour
    assert cost.egress_per_hour == 0.165 and cost.total_per_hour == round(2.9 + 0.165, 4) and cost.unknown == ("c",)
    assert prices.egress_per_gb("inter_region", "us-east-1") == 0.02 and prices.egress_per_gb("internet", "eu-west-1") == 0.09
    assert (
        prices.egress_per_gb("same_region", "us-east-1") == 0.0 and prices.egress_per_gb("inter_region", "ap-northeast-1") == 0.09
    )


def test_up_plan_on_the_example_prices_each_region_and_changes_nothing(aws: AwsCloud) -> None:
    answer_spot(aws, "us-east-1", US_EAST)
    answer_spot(aws, "eu-west-1", [[("g6.xlarge", "eu-west-1a", 0.31, NOW)]])
    aws.answer_quota("L-3819A6DF", 32, region="us-east-1")  # eu-west-1's cannot be read: moto does not know it
    aws.answer_quota(ON_DEMAND_QUOTAS["g"].code, 4, region="us-east-1")  # the on-demand syncer's 4 vCPUs: exactly enough
    result = CliRunner().invoke(app, ["up", "-f", str(EXAMPLE), "--plan", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    virginia, ireland = plan["regions"]
    assert (virginia["instance_type"], virginia["zone"], virginia["spot_per_hour"], virginia["instances"]) == (
        "g5.xlarge",
        "us-east-1a",
        0.33,
        3,
    )
    [first] = virginia["warnings"]  # the spot quota (32) holds its learners' 8 vCPUs, the on-demand one its syncer's 4
    assert "up tries g6.xlarge in us-east-1a first ($0.4012/h); the cheapest is g5.xlarge in us-east-1a" in first
    assert "could not check quota L-3819A6DF" in ireland["warnings"][0]
    assert virginia["egress_gb_per_hour"] > 0 and ireland["egress_per_hour"] > 0
    syncer = virginia["on_demand_per_hour"]  # the syncer runs on demand beside virginia's two spot learners
    assert plan["cost"]["dollars_per_hour"] == round(2 * 0.33 + syncer + 2 * 0.31, 4) and syncer > 0.33
    assert any("assumed 1 s per step" in note for note in plan["cost"]["notes"])
    actions = {c.action for c in aws.calls()}
    assert actions and all(a.startswith(("Describe", "Get", "List")) for a in actions), actions  # read only
    table = CliRunner().invoke(app, ["up", "-f", str(EXAMPLE), "--plan"])
    assert table.exit_code == 0 and "g5.xlarge" in table.stdout and "warning: ireland: eu-west-1: could not check" in table.stdout


def test_a_dry_run_plan_prices_every_region_at_zero_and_calls_no_cloud(aws: AwsCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(providers, "unavailable", lambda kind: "no engine in this test")  # played by processes
    result = CliRunner().invoke(app, ["up", "-f", str(EXAMPLE), "--plan", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["cost"]["total_dollars_per_hour"] == 0 and all(r["egress_gb_per_hour"] == 0 for r in plan["regions"])
    assert aws.calls() == []


def test_hostile_answers_are_skipped_or_unknown_never_a_crash_or_a_nan(aws: AwsCloud) -> None:
    """What EC2 or Service Quotas answer is checked: a price or count that is not a finite, sane number is not used."""
    hostile: list[tuple[str, str, float | str, str]] = [
        ("g6.xlarge", "us-east-1a", "NaN", NOW),
        ("g6.xlarge", "us-east-1b", "Infinity", NOW),
        ("g6.xlarge", "us-east-1c", "-0.5", NOW),
        ("g5.xlarge", "us-east-1a", "1e308", NOW),
        ("g5.xlarge", "us-east-1b", 0.29, NOW),  # the one usable offer
    ]
    answer_spot(aws, "us-east-1", [hostile])
    ec2 = Clients().client("ec2", "us-east-1")
    quote = prices.spot_quote(ec2, ["g6.xlarge", "g5.xlarge"], [])
    assert quote is not None and (quote.instance_type, quote.zone, quote.price) == ("g5.xlarge", "us-east-1b", 0.29)
    answer_spot(aws, "us-east-1", [hostile[:4]])
    assert prices.spot_quote(ec2, ["g6.xlarge", "g5.xlarge"], []) is None  # nothing usable: unknown, not nan
    assert prices.latest_prices([{"SpotPrice": "0.3"}, {"InstanceType": True, "SpotPrice": [1]}], ["g5.xlarge"], []) == {}

    sq = Clients().client("service-quotas", "us-east-1")
    for broken in ("NaN", "-3", "1e300"):
        aws.answer_quota(G.code, float(broken), region="us-east-1")
        [warning] = prices.quota_warnings(sq, "us-east-1", {G: 4})
        assert "could not check quota L-3819A6DF" in warning and "not a number of vCPUs" in warning and "nan vCPUs" not in warning

    class Paginated:  # DescribeInstanceTypes answers with counts that are not counts
        def get_paginator(self, name: str) -> Any:
            types = [
                {"InstanceType": f"t{i}", "VCpuInfo": {"DefaultVCpus": v}} for i, v in enumerate([4, -1, 10**9, "x", None, 2.5])
            ]
            return type("P", (), {"paginate": lambda self, **kw: [{"InstanceTypes": types}]})()

    assert prices.vcpus(Paginated(), ["t0"]) == {"t0": 4}
