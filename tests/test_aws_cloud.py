"""The offline AWS: moto answers through a real endpoint, and the fault layer says no the way EC2 does."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto.ec2.models import elastic_ip_addresses, elastic_network_interfaces

from aws_cloud import PUBLIC_POOL, AwsCloud

AMI = "ami-12c6146b"  # one of moto's built-in images
ONE_SHOT = Config(retries={"total_max_attempts": 1, "mode": "standard"})


@pytest.fixture(scope="module")
def started() -> Iterator[AwsCloud]:
    with AwsCloud() as cloud:
        yield cloud


@pytest.fixture
def cloud(started: AwsCloud) -> AwsCloud:
    started.reset()
    return started


def run(ec2: Any, **kwargs: Any) -> dict[str, Any]:
    instances: list[dict[str, Any]] = ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="g5.xlarge", **kwargs)[
        "Instances"
    ]
    return instances[0]


def error_code(err: pytest.ExceptionInfo[ClientError]) -> str:
    return str(err.value.response["Error"]["Code"])


def test_moto_answers_behind_the_endpoint(cloud: AwsCloud) -> None:
    ec2 = cloud.client("ec2")
    ec2.create_key_pair(KeyName="ddctl")
    assert [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]] == ["ddctl"]
    assert ec2.describe_vpcs()["Vpcs"][0]["IsDefault"]
    call = cloud.calls("CreateKeyPair")[0]
    assert (call.service, call.region, call.status, call.faulted, call.params["KeyName"]) == (
        "ec2",
        "us-east-1",
        200,
        False,
        "ddctl",
    )


def test_env_points_a_plain_boto3_session_here(cloud: AwsCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in cloud.env().items():
        monkeypatch.setenv(name, value)
    boto3.session.Session().client("ec2").describe_regions()
    assert [c.action for c in cloud.calls()] == ["DescribeRegions"]


def test_spot_instances_and_elastic_ips_get_unique_pool_addresses(cloud: AwsCloud) -> None:
    ec2 = cloud.client("ec2")
    instance = run(ec2, InstanceMarketOptions={"MarketType": "spot"})
    assert instance["InstanceLifecycle"] == "spot"
    eip = ec2.allocate_address(Domain="vpc")["PublicIp"]
    addresses = [ipaddress.IPv4Address(a) for a in (instance["PublicIpAddress"], eip, run(ec2)["PublicIpAddress"])]
    assert all(a in PUBLIC_POOL and a not in (PUBLIC_POOL[0], PUBLIC_POOL[1], PUBLIC_POOL[-1]) for a in addresses)
    assert len(set(addresses)) == 3
    cloud.reset()
    assert ipaddress.IPv4Address(run(ec2)["PublicIpAddress"]) not in addresses, "an address is never handed out twice"


def test_capacity_fault_in_one_zone_and_botocores_silent_retries(cloud: AwsCloud) -> None:
    cloud.fail("RunInstances", "InsufficientInstanceCapacity", zone="us-east-1a")
    with pytest.raises(ClientError) as err:
        run(cloud.client("ec2", config=ONE_SHOT), Placement={"AvailabilityZone": "us-east-1a"})
    assert error_code(err) == "InsufficientInstanceCapacity"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert "g5.xlarge capacity in the Availability Zone you requested (us-east-1a)" in str(err.value)
    assert [(c.zone, c.status, c.faulted) for c in cloud.calls("RunInstances")] == [("us-east-1a", 500, True)]

    ec2 = cloud.client("ec2")  # botocore's default: standard mode, 3 attempts, and a 500 is "transient"
    with pytest.raises(ClientError) as err:
        run(ec2, Placement={"AvailabilityZone": "us-east-1a"})
    assert error_code(err) == "InsufficientInstanceCapacity"
    assert len(cloud.calls("RunInstances")) == 1 + 3

    assert run(ec2, Placement={"AvailabilityZone": "us-east-1b"})["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert [(c.zone, c.status) for c in cloud.calls("RunInstances")][-1] == ("us-east-1b", 200)


def test_zone_of_a_subnet_counts_for_the_zone_filter(cloud: AwsCloud) -> None:
    ec2 = cloud.client("ec2", config=ONE_SHOT)
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="172.31.200.0/24", AvailabilityZone="us-east-1c")["Subnet"]["SubnetId"]
    cloud.fail("RunInstances", "Unsupported", zone="us-east-1c")
    with pytest.raises(ClientError) as err:
        run(ec2, SubnetId=subnet)
    assert error_code(err) == "Unsupported"
    with pytest.raises(ClientError):
        run(ec2, NetworkInterfaces=[{"DeviceIndex": 0, "SubnetId": subnet, "AssociatePublicIpAddress": True}])
    assert [(c.zone, c.status) for c in cloud.calls("RunInstances")] == [("us-east-1c", 400)] * 2
    assert run(ec2)["InstanceId"]  # no zone named: not this fault's business


def test_region_filter(cloud: AwsCloud) -> None:
    cloud.fail("DescribeSpotPriceHistory", "UnauthorizedOperation", region="eu-west-1")
    cloud.client("ec2", "us-east-1", ONE_SHOT).describe_spot_price_history(InstanceTypes=["g5.xlarge"])
    with pytest.raises(ClientError) as err:
        cloud.client("ec2", "eu-west-1", ONE_SHOT).describe_spot_price_history(InstanceTypes=["g5.xlarge"])
    assert error_code(err) == "UnauthorizedOperation"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert [(c.region, c.faulted) for c in cloud.calls("DescribeSpotPriceHistory")] == [("us-east-1", False), ("eu-west-1", True)]
    assert cloud.calls(region="eu-west-1") == cloud.calls("DescribeSpotPriceHistory")[1:]


def test_a_fault_for_one_time_then_passes_and_clear_removes_faults(cloud: AwsCloud) -> None:
    ec2 = cloud.client("ec2", config=ONE_SHOT)
    cloud.fail("CreateSecurityGroup", "InvalidParameterValue", message="nope", times=1)
    with pytest.raises(ClientError, match="nope"):
        ec2.create_security_group(GroupName="a", Description="a")
    ec2.create_security_group(GroupName="a", Description="a")
    cloud.fail("CreateSecurityGroup", "InternalError")
    cloud.clear()
    ec2.create_security_group(GroupName="b", Description="b")
    assert [c.status for c in cloud.calls("CreateSecurityGroup")] == [400, 200, 200]


def test_service_quotas_answers_and_json_faults(cloud: AwsCloud) -> None:
    quotas = cloud.client("service-quotas", config=ONE_SHOT)
    cloud.answer_quota("L-3819A6DF", 64)
    assert quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-3819A6DF")["Quota"]["Value"] == 64.0
    with pytest.raises(ClientError) as err:  # another code is moto's business, and moto knows no EC2 quotas
        quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-34B43A08")
    assert error_code(err) == "NoSuchResourceException"
    cloud.fail("GetServiceQuota", "AccessDeniedException")
    with pytest.raises(ClientError) as err:
        quotas.get_service_quota(ServiceCode="ec2", QuotaCode="L-3819A6DF")
    assert error_code(err) == "AccessDeniedException"
    assert {(c.service, c.action) for c in cloud.calls()} == {("servicequotas", "GetServiceQuota")}


def test_rest_json_actions_are_named_from_the_route(cloud: AwsCloud) -> None:
    fis = cloud.client("fis", config=ONE_SHOT)
    cloud.fail("StartExperiment", "ValidationException", message="no such template")
    with pytest.raises(ClientError, match="no such template") as err:
        fis.start_experiment(experimentTemplateId="EXT123")
    assert error_code(err) == "ValidationException"
    fis.list_experiments()
    assert [(c.service, c.action, c.faulted) for c in cloud.calls()] == [
        ("fis", "StartExperiment", True),
        ("fis", "ListExperiments", False),
    ]
    assert cloud.calls()[0].params["experimentTemplateId"] == "EXT123"


def test_reset_wipes_instances_faults_and_the_log(cloud: AwsCloud) -> None:
    ec2 = cloud.client("ec2", config=ONE_SHOT)
    run(ec2)
    cloud.fail("DescribeInstances", "Unavailable")
    cloud.reset()
    assert ec2.describe_instances()["Reservations"] == []
    assert [c.action for c in cloud.calls()] == ["DescribeInstances"]


def test_stop_undoes_the_address_patch(cloud: AwsCloud) -> None:
    def drawers() -> list[Any]:
        return [vars(elastic_ip_addresses)["random_ip"], vars(elastic_network_interfaces)["random_public_ip"]]

    before = drawers()
    with AwsCloud():
        assert drawers() != before
    assert drawers() == before
