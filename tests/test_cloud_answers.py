"""What a cloud API answers is checked in shape before it is stored or dialled (found by a hostile-input audit of
the answers the tools act on): an instance EC2 describes without a state or with a made-up id is skipped, not a
KeyError that ended the controller; an instance id EC2 answers goes into the state only as one; a reserved
address is an IPv4 address before it becomes every learner's URL and a name in the run's certificate."""

from __future__ import annotations

from typing import Any

import pytest

from ddctl.errors import DdctlError
from ddctl.providers.aws import network
from ddctl.providers.aws.provider import AwsProvider
from ddctl.providers.base import answered_ipv4

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
    assert sum("EC2 described an instance of another shape: skipped" in m for m in caplog.messages) == len(odd)
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
