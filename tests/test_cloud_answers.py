"""What a cloud API answers is checked in shape before it is stored or dialled (found by a hostile-input audit of
the answers the tools act on): an instance EC2 describes without a state or with a made-up id is skipped, not a
KeyError that ended the controller; an instance id EC2 answers goes into the state only as one; a reserved
address is an IPv4 address before it becomes every learner's URL and a name in the run's certificate."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from ddctl.config.regions import Region
from ddctl.errors import DdctlError
from ddctl.providers.aws import network, orphans
from ddctl.providers.aws.prices import quote_regions
from ddctl.providers.aws.provider import AwsProvider
from ddctl.providers.base import Instance, answered_ipv4
from ddctl.providers.firstboot import SSH_FROM_ENV, ssh_cidr

GOOD = {"InstanceId": "i-0123456789abcdef0", "State": {"Name": "running"}, "Placement": {"AvailabilityZone": "us-east-1a"}}


class Paginator:
    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages

    def paginate(self, **_: Any) -> list[dict[str, Any]]:
        return self.pages


class Ec2:
    """EC2 answering what a test says."""

    def __init__(self, pages: list[dict[str, Any]] | None = None, **answers: Any) -> None:
        self.pages, self.answers = pages or [], answers

    def get_paginator(self, _: str) -> Paginator:
        return Paginator(self.pages)

    def __getattr__(self, name: str) -> Any:
        return lambda **_: self.answers[name]


def provider_of(ec2: Ec2, monkeypatch: pytest.MonkeyPatch) -> AwsProvider:
    provider = AwsProvider.__new__(AwsProvider)
    monkeypatch.setattr(provider, "ec2", lambda region, **_: ec2)
    return provider


def test_described_instances_of_another_shape_are_skipped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    odd = [
        {"InstanceId": "i-1123456789abcdef0"},  # no State
        {**GOOD, "State": None},
        {**GOOD, "Placement": "us-east-1a"},
        {**GOOD, "InstanceId": "i-0feed\n2026-05-01T00:00:00Z INFO forged"},
        "an instance",
    ]
    pages = [{"Reservations": [{"Instances": [GOOD, *odd]}]}, {"NextToken": "x"}, {"Reservations": [{}]}]
    provider = provider_of(Ec2(pages), monkeypatch)
    assert provider.describe("us-east-1", run="r") == [GOOD]
    assert sum("EC2 described an instance of another shape: skipped" in m for m in caplog.messages) == len(odd) - 1
    assert sum("AWS answered DescribeInstances with 1 Instances of another shape" in m for m in caplog.messages) == 1
    assert not any("\n2026" in m for m in caplog.messages)  # the odd answer is logged as its repr: no forged line


def test_what_ec2_names_an_instance_is_told_by_its_pattern() -> None:
    """The pattern every id EC2 answers must match (``run_instances``' too) before it is stored or written to the
    footprint's whitespace-separated files."""
    from ddctl.providers.aws.machines import INSTANCE_ID

    assert INSTANCE_ID.fullmatch("i-0123456789abcdef0") and INSTANCE_ID.fullmatch("i-12345678")
    for bad in ("i-0feed\nforged", "i-XYZ12345", "sg-12345678", "i-0123456789abcdef01"):
        assert not INSTANCE_ID.fullmatch(bad), bad


@pytest.mark.parametrize("answered", ["203.0.113.5@evil.example", "10.0.0.1\nevil", None, 7, "::1"])
def test_a_reserved_address_must_be_ipv4(answered: object) -> None:
    ec2 = Ec2(describe_addresses={"Addresses": [{"AllocationId": "eipalloc-1", "PublicIp": answered}]})
    with pytest.raises(DdctlError, match=r"EC2's Elastic IP of syncer is not an IPv4 address"):
        network.ensure_address(ec2, "r")
    fresh = Ec2(describe_addresses={"Addresses": []}, allocate_address={"AllocationId": "eipalloc-2", "PublicIp": answered})
    with pytest.raises(DdctlError, match=r"EC2's new Elastic IP of syncer-s1 is not an IPv4 address"):
        network.ensure_address(fresh, "r", "syncer-s1")
    good = Ec2(describe_addresses={"Addresses": [{"AllocationId": "eipalloc-1", "PublicIp": "203.0.113.5"}]})
    assert network.ensure_address(good, "r") == ("eipalloc-1", "203.0.113.5")
    assert answered_ipv4("198.51.100.7", "x") == "198.51.100.7"


class Ec2Region(Ec2):
    """An ``Ec2`` that knows its region, as a boto3 client does."""

    def __init__(self, pages: list[Any] | None = None, **answers: Any) -> None:
        super().__init__(pages, **answers)
        self.meta = SimpleNamespace(region_name="us-east-1")
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        def call(**kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            return self.answers.get(name, {})

        return call


class QuotedClients:
    """What ``prices.quote_regions`` asks for its clients: EC2 and Service Quotas answering what a test says."""

    described = "profile 'test'"

    def __init__(self, ec2: Any, quotas: Any) -> None:
        self.ec2, self.quotas = ec2, quotas

    def client(self, service: str, region: str) -> Any:
        return self.ec2 if service == "ec2" else self.quotas


class Pages:
    """A client whose every paginator yields ``pages``."""

    def __init__(self, pages: dict[str, list[Any]]) -> None:
        self.pages = pages

    def get_paginator(self, name: str) -> Paginator:
        return Paginator(self.pages[name])


def quoted(pages: dict[str, list[Any]], quota_answer: object) -> Any:
    region = Region(name="virginia", provider="aws", cloud_region="us-east-1", instance_types=("g5.xlarge",))
    quotas = SimpleNamespace(get_service_quota=lambda **_: quota_answer)
    return quote_regions([region], {"virginia": 2}, {}, QuotedClients(Pages(pages), quotas))["virginia"]  # type: ignore[arg-type]


PRICED = {"InstanceType": "g5.xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "0.3"}
TYPED = {"InstanceType": "g5.xlarge", "VCpuInfo": {"DefaultVCpus": 4}}


@pytest.mark.parametrize(
    "history",
    [[{"SpotPriceHistory": "0.3"}], [{"SpotPriceHistory": {"g5.xlarge": 0.3}}], ["a page"], [None]],
)
def test_a_price_history_without_its_list_is_a_plan_warning_not_a_traceback(history: list[Any]) -> None:
    """``up --plan`` showed a KeyError or TypeError traceback for such an answer; it is the region's warning."""
    quote = quoted({"describe_spot_price_history": history, "describe_instance_types": [{"InstanceTypes": [TYPED]}]}, {})
    assert quote.spot_per_hour is None and quote.vcpus == 4
    assert any(
        w.startswith("could not read spot prices: AWS answered DescribeSpotPriceHistory without a list of SpotPriceHistory")
        for w in quote.warnings
    ), quote.warnings


def test_items_of_another_shape_are_skipped_and_the_rest_are_read(caplog: pytest.LogCaptureFixture) -> None:
    pages = {
        "describe_spot_price_history": [{"SpotPriceHistory": ["0.1", None, PRICED, 7]}],
        "describe_instance_types": [{"InstanceTypes": ["g5.xlarge", {"InstanceType": "g5.xlarge", "VCpuInfo": [4]}]}],
    }
    quote = quoted(pages, {"Quota": {"Value": 64.0}})
    assert (quote.instance_type, quote.zone, quote.spot_per_hour) == ("g5.xlarge", "us-east-1a", 0.3)
    assert quote.vcpus is None  # VCpuInfo of another shape: unknown, and the quota check says it could not
    assert quote.warnings == ("us-east-1: could not check the vCPU quota for g5.xlarge: its vCPUs are unknown",)
    assert any("AWS answered DescribeSpotPriceHistory with 3 SpotPriceHistory of another shape" in m for m in caplog.messages)


@pytest.mark.parametrize("answer", [["Quota"], {"Quota": "64"}, {"Quota": [64]}, {"Quota": {"Value": {"v": 64}}}, None])
def test_a_quota_answer_of_another_shape_is_a_warning(answer: object) -> None:
    quote = quoted(
        {
            "describe_spot_price_history": [{"SpotPriceHistory": [PRICED]}],
            "describe_instance_types": [{"InstanceTypes": [TYPED]}],
        },
        answer,
    )
    [warning] = quote.warnings
    assert warning.startswith("us-east-1: could not check quota L-3819A6DF") and "not a number of vCPUs" in warning
    assert "needs 8 vCPUs" in warning


def test_orphans_without_a_state_are_left_alone_and_the_rest_swept(caplog: pytest.LogCaptureFixture) -> None:
    """``down --orphans`` ended in a KeyError on an instance described without ``State``: nothing was swept."""
    dead = [{"Key": "ddctl-run", "Value": "gone"}]
    stateless = {"InstanceId": "i-1123456789abcdef0", "Tags": dead}
    pages = [{"Reservations": [{"Instances": [{**GOOD, "Tags": dead}, stateless, "i-2123456789abcdef0"]}, "r"]}]
    ec2 = Ec2Region(pages, describe_security_groups={"SecurityGroups": []}, describe_addresses={"Addresses": []})
    doomed: list[list[str]] = []
    removed = orphans.sweep(ec2, set(), 0.0, doomed.append)
    assert doomed == [["i-0123456789abcdef0"]]  # never guess to delete: the stateless one stays
    assert removed[0] == ("instance", "us-east-1/gone/i-0123456789abcdef0")
    assert sum("EC2 described an instance of another shape" in m for m in caplog.messages) == 1


@pytest.mark.parametrize(
    "answers",
    [
        {"describe_security_groups": {"SecurityGroups": "sg-1"}},
        {"describe_security_groups": {"SecurityGroups": [{"GroupId": None}]}},
        {"describe_addresses": {"Addresses": [{"PublicIp": "203.0.113.5"}]}},  # no AllocationId to release
        {"describe_key_pairs": {"KeyPairs": [{"KeyName": ["k"]}]}},
    ],
)
def test_removing_a_network_on_answers_of_another_shape_names_the_call(answers: dict[str, Any]) -> None:
    """Each was a KeyError or a call with ``str(None)``; now a DdctlError naming the call and the field."""
    ec2 = Ec2Region(**answers)
    with pytest.raises(DdctlError, match=r"AWS answered (DescribeSecurityGroups|DescribeAddresses|DescribeKeyPairs) with"):
        network.remove_network(ec2, "r")
    assert not any(name.startswith(("delete_security_group", "release_address")) for name, _ in ec2.calls)


def test_a_removed_network_is_reported_by_what_was_answered() -> None:
    ec2 = Ec2Region(
        describe_addresses={"Addresses": [{"AllocationId": "eipalloc-1", "PublicIp": "203.0.113.5\nforged"}]},
        describe_key_pairs={"KeyPairs": [{"KeyName": "ddctl-r"}]},
        describe_security_groups={"SecurityGroups": [{"GroupId": "sg-1"}]},
    )
    assert network.remove_network(ec2, "r") == [
        ("elastic ip", "us-east-1/eipalloc-1"),  # an answered address that is none is not shown: its allocation is
        ("key pair", "us-east-1/ddctl-r"),
        ("security group", "us-east-1/sg-1"),
    ]
    assert ("release_address", {"AllocationId": "eipalloc-1"}) in ec2.calls


def test_the_cidrs_a_port_is_open_to_are_read_in_shape() -> None:
    rules = [{"FromPort": 8443, "IpRanges": [{"CidrIp": "198.51.100.7/32"}, "x"]}, {"FromPort": 22, "IpRanges": []}]
    assert network.opened(Ec2Region(describe_security_groups={"SecurityGroups": [{"IpPermissions": rules}]}), "sg-1", 8443) == {
        "198.51.100.7/32"
    }
    broken = [{"FromPort": 8443, "IpRanges": {"CidrIp": "0.0.0.0/0"}}]
    with pytest.raises(DdctlError, match="AWS answered DescribeSecurityGroups without a list of IpRanges"):
        network.opened(Ec2Region(describe_security_groups={"SecurityGroups": [{"IpPermissions": broken}]}), "sg-1", 8443)


@pytest.mark.parametrize(
    ("chosen", "rule"), [("203.0.113.7", "203.0.113.7/32"), (" 10.1.2.3/24 ", "10.1.2.0/24"), ("0.0.0.0/0", "0.0.0.0/0")]
)
def test_the_operators_cidr_is_an_ipv4_network(chosen: str, rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SSH_FROM_ENV, chosen)
    assert ssh_cidr() == rule


@pytest.mark.parametrize("chosen", ["1.2.3.4/33", "laptop", "2001:db8::1", "1.2.3.4/32 5.6.7.8/32"])
def test_an_operators_cidr_that_is_none_is_refused_with_an_example(chosen: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SSH_FROM_ENV, chosen)
    with pytest.raises(DdctlError, match=r"DDCTL_SSH_FROM=.* is not an IPv4 address or CIDR \(e\.g\. 203\.0\.113\.7"):
        ssh_cidr()


@pytest.mark.parametrize("answered", ["<html>captive portal</html>", "203.0.113.7/0", "0.0.0.0/0", "203.0.113.7, 10.0.0.1"])
def test_what_checkip_answers_must_be_one_address(answered: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer becomes the rule SSH and the admin port are opened to: ``0.0.0.0/0`` became ``0.0.0.0/0/32``."""
    monkeypatch.delenv(SSH_FROM_ENV, raising=False)
    monkeypatch.setattr(httpx, "get", lambda *_, **__: SimpleNamespace(text=answered))
    with pytest.raises(DdctlError, match=r"checkip\.amazonaws\.com answered .*, not this machine's IPv4 address; set DDCTL_SSH"):
        ssh_cidr()
    monkeypatch.setattr(httpx, "get", lambda *_, **__: SimpleNamespace(text=" 203.0.113.7\n"))
    assert ssh_cidr() == "203.0.113.7/32"


def test_an_instances_host_key_tag_is_pinned_only_as_one_ed25519_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tag that began with ``ssh-ed25519 `` was pinned whole: a newline in it added a ``known_hosts`` line of its own."""
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAknQxho8mOTK2n+7SZXAhF2rWcVg9Rmmf1ZVihJcoId"
    instance = Instance(name="L0", provider_id="us-east-1/i-0123456789abcdef0", run="r", alive=True, address="203.0.113.5")
    for tag, pinned in ((key, True), (f"{key}\n* ssh-ed25519 AAAAC3Nzattacker", False), ("ssh-ed25519 x", False)):
        raw = {**GOOD, "PublicIpAddress": "203.0.113.5", "Tags": [{"Key": "ddctl-host-key", "Value": tag}]}
        provider = provider_of(Ec2([{"Reservations": [{"Instances": [raw]}]}]), monkeypatch)
        if pinned:
            assert provider.ssh_target(instance).host_key == key
            continue
        with pytest.raises(DdctlError, match="L0 carries no ddctl-host-key tag ddctl could pin; not connecting"):
            provider.ssh_target(instance)
