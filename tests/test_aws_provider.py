"""The aws provider against moto's real HTTP server and a fault layer: bootstrap, create with failover, cleanup, orphans.

No VM boots here (``tests/test_aws_e2e.py`` boots them as Docker containers):
the first-boot wait and the agent's deploy are stood in for, everything EC2
is asked is real and read back from moto.
"""

from __future__ import annotations

import ipaddress
import json
import time
from pathlib import Path
from typing import Any

import pytest

from aws_cloud import AwsCloud
from builders import machines_that_would_answer
from ddctl.config.regions import Region
from ddctl.control.controller import Controller
from ddctl.control.rundir import RunDir
from ddctl.control.state import InstanceRecord, State
from ddctl.errors import DdctlError, ProvisionError
from ddctl.providers.aws import provider as aws_provider
from ddctl.providers.aws.clients import Clients
from ddctl.providers.aws.provider import SYNCER_PORT, AwsProvider
from ddctl.providers.base import InstanceSpec

RUN = "r1"
OPERATOR = "100.100.0.1/32"  # DDCTL_SSH_FROM in the fixture: the laptop's address
IMAGE = "ami-12c6146b"  # one of moto's stock AMIs
EAST = Region(
    name="east",
    provider="aws",
    cloud_region="us-east-1",
    zones=("us-east-1a", "us-east-1b"),
    instance_types=("g6.xlarge", "g5.xlarge"),
    image=IMAGE,
    python="/usr/bin/python3",
)
WEST = Region(
    name="west", provider="aws", cloud_region="eu-west-1", instance_type="g5.xlarge", image=IMAGE, python="/usr/bin/python3"
)


@pytest.fixture
def booted(aws: AwsCloud, monkeypatch: pytest.MonkeyPatch) -> AwsCloud:
    """VMs that would answer: the first-boot wait passes and the deploy is a no-op (no machine boots in these tests)."""
    machines_that_would_answer(monkeypatch, aws_provider)
    return aws


def spec_of(infos: dict[str, Any], name: str, region: Region, role: str = "learner", zone: str = "") -> InstanceSpec:
    return InstanceSpec(
        run=RUN,
        name=name,
        region=region.name,
        role=role,
        argv=("python3", "-m", "agent"),
        log=RunDir(RUN).log(name),
        cloud_region=region.cloud_region,
        zone=zone,
        machine=infos[region.name].machine,
    )


def groups(aws: AwsCloud, region: str) -> list[dict[str, Any]]:
    return aws.client("ec2", region).describe_security_groups(Filters=[{"Name": "tag:ddctl-run", "Values": [RUN]}])[
        "SecurityGroups"
    ]


def port_sources(group: dict[str, Any], port: int) -> set[str]:
    return {r["CidrIp"] for p in group["IpPermissions"] if p.get("FromPort") == port for r in p.get("IpRanges", [])}


def test_bootstrap_is_idempotent_and_opens_ssh_to_the_operator_only(aws: AwsCloud) -> None:
    provider = AwsProvider()
    infos = provider.bootstrap(RUN, [EAST, WEST], "east")
    assert provider.bootstrap(RUN, [EAST, WEST], "east") == infos
    fresh = AwsProvider().bootstrap(RUN, [EAST, WEST], "east")  # another process (the controller) finds the same things
    assert fresh == infos
    address = infos["east"].syncer_host
    assert address == infos["west"].syncer_host and infos["east"].syncer_port == SYNCER_PORT  # every learner: the Elastic IP
    eips = aws.client("ec2", "us-east-1").describe_addresses()["Addresses"]
    assert [e["PublicIp"] for e in eips] == [address] and aws.client("ec2", "eu-west-1").describe_addresses()["Addresses"] == []
    for region in ("us-east-1", "eu-west-1"):
        (group,) = groups(aws, region)
        assert port_sources(group, 22) == port_sources(group, SYNCER_PORT) == {OPERATOR}
        pairs = aws.client("ec2", region).describe_key_pairs()["KeyPairs"]
        assert [p["KeyName"] for p in pairs] == [f"ddctl-{RUN}"]
    assert infos["east"].notice_url == "http://169.254.169.254/latest/meta-data/spot/instance-action"
    assert infos["east"].python == "/usr/bin/python3" and infos["east"].machine["instance_types"] == ["g6.xlarge", "g5.xlarge"]


def member_rules(group: dict[str, Any]) -> list[dict[str, Any]]:
    """The group's ingress rules whose source is a security group (not an address range)."""
    return [p for p in group["IpPermissions"] if p.get("UserIdGroupPairs")]


def test_the_runs_vms_of_a_region_reach_each_other_on_every_tcp_port_and_nothing_else_does(aws: AwsCloud) -> None:
    provider = AwsProvider()
    provider.bootstrap(RUN, [EAST, WEST], "east")
    AwsProvider().bootstrap(RUN, [EAST, WEST], "east")  # another process: asks again, is told it is there, goes on
    for region in ("us-east-1", "eu-west-1"):
        (group,) = groups(aws, region)
        (rule,) = member_rules(group)  # one rule, not one per bootstrap
        assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 0, 65535)
        assert [pair["GroupId"] for pair in rule["UserIdGroupPairs"]] == [group["GroupId"]]  # from the group itself
        assert rule["IpRanges"] == [] and rule.get("Ipv6Ranges", []) == []  # from no address range
        wide = [p for p in group["IpPermissions"] if p.get("FromPort") != p.get("ToPort") and p is not rule]
        assert wide == []  # every other rule is one port
    asked = aws.calls("AuthorizeSecurityGroupIngress", region="us-east-1")
    self_rules = [c for c in asked if any(k.endswith("Groups.1.GroupId") for k in c.params)]
    assert [c.status for c in self_rules] == [200, 400]  # the second answered InvalidPermission.Duplicate, taken as done

    ec2 = aws.client("ec2", "us-east-1")  # a group an older ddctl made, without the rule: the next bootstrap adds it
    (group,) = groups(aws, "us-east-1")
    ec2.revoke_security_group_ingress(GroupId=group["GroupId"], IpPermissions=member_rules(group))
    assert member_rules(groups(aws, "us-east-1")[0]) == []
    AwsProvider().bootstrap(RUN, [EAST], "east")
    assert len(member_rules(groups(aws, "us-east-1")[0])) == 1


def test_create_and_list_run_say_where_the_regions_other_vms_reach_an_instance(
    booted: AwsCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = AwsProvider()
    infos = provider.bootstrap(RUN, [EAST], "east")
    made = [provider.create(spec_of(infos, name, EAST, role=role)) for name, role in (("syncer", "syncer"), ("L0", "learner"))]
    ec2 = booted.client("ec2", "us-east-1")
    for instance in made:
        (vm,) = ec2.describe_instances(InstanceIds=[instance.provider_id.split("/")[1]])["Reservations"][0]["Instances"]
        (subnet,) = ec2.describe_subnets(SubnetIds=[vm["SubnetId"]])["Subnets"]
        assert instance.private_address == vm["PrivateIpAddress"] != instance.address
        assert ipaddress.IPv4Address(instance.private_address) in ipaddress.IPv4Network(subnet["CidrBlock"])
    assert made[0].private_address != made[1].private_address
    listed = {i.name: i.private_address for i in provider.list_run(RUN)}
    assert listed == {i.name: i.private_address for i in made}

    real = AwsProvider.describe

    def garbled(self: AwsProvider, region: str, ids: list[str] | None = None, run: str = "") -> list[dict[str, Any]]:
        return [raw | {"PrivateIpAddress": "10.0.0.300"} for raw in real(self, region, ids, run)]

    monkeypatch.setattr(AwsProvider, "describe", garbled)  # EC2 answering nonsense: no address, never the nonsense
    by_name = sorted(made, key=lambda i: i.name)
    assert [(i.private_address, i.address) for i in provider.list_run(RUN)] == [("", i.address) for i in by_name]


def test_create_falls_to_the_next_instance_type_once_each_then_gives_the_zone_up(booted: AwsCloud) -> None:
    provider = AwsProvider()
    infos = provider.bootstrap(RUN, [EAST], "east")
    booted.fail("RunInstances", "InsufficientInstanceCapacity", zone="us-east-1a", times=1)
    made = provider.create(spec_of(infos, "L0", EAST, zone="us-east-1a"))
    tried = [(c.params.get("InstanceType"), c.status) for c in booted.calls("RunInstances")]
    assert tried == [("g6.xlarge", 500), ("g5.xlarge", 200)]  # one attempt each: botocore did not retry the 500
    raw = booted.client("ec2", "us-east-1").describe_instances(InstanceIds=[made.provider_id.split("/")[1]])
    (vm,) = raw["Reservations"][0]["Instances"]
    assert (
        vm["InstanceType"] == "g5.xlarge"
        and vm["InstanceLifecycle"] == "spot"
        and vm["Placement"]["AvailabilityZone"] == "us-east-1a"
    )
    assert vm["MetadataOptions"]["HttpTokens"] == "required" and made.address == vm["PublicIpAddress"]
    (group,) = groups(booted, "us-east-1")
    assert port_sources(group, SYNCER_PORT) == {OPERATOR, f"{made.address}/32"}  # the syncer's port: the operator, this learner
    assert f"{made.address} ssh-ed25519 " in RunDir(RUN).known_hosts.read_text()  # its host key is pinned

    booted.fail("RunInstances", "InsufficientInstanceCapacity", zone="us-east-1a")
    before = len(booted.calls("RunInstances"))
    with pytest.raises(ProvisionError) as refused:
        provider.create(spec_of(infos, "L1", EAST, zone="us-east-1a"))
    assert (refused.value.kind, refused.value.scope, refused.value.zone) == ("capacity", "zone", "us-east-1a")
    assert len(booted.calls("RunInstances")) - before == 2  # each type once, no silent retries

    provider.retire(provider.list_run(RUN)[0], RunDir(RUN).log("L0"))
    assert provider.list_run(RUN) == [] and port_sources(groups(booted, "us-east-1")[0], SYNCER_PORT) == {OPERATOR}


def test_the_syncer_is_on_demand_behind_the_elastic_ip(booted: AwsCloud) -> None:
    provider = AwsProvider()
    infos = provider.bootstrap(RUN, [EAST], "east")
    made = provider.create(spec_of(infos, "syncer", EAST, role="syncer"))
    vm = booted.client("ec2", "us-east-1").describe_instances(InstanceIds=[made.provider_id.split("/")[1]])["Reservations"][0][
        "Instances"
    ][0]
    assert "InstanceLifecycle" not in vm and made.address == infos["east"].syncer_host == vm["PublicIpAddress"]


def controller_world(tmp_path: Path, placements: list[dict[str, str]]) -> tuple[State, Controller]:
    provider = AwsProvider()
    infos = provider.bootstrap(RUN, [EAST, WEST], "east")
    state = State(tmp_path / "state.sqlite3")
    state.create_run(RUN, "aws.yaml", str(tmp_path / "job"), {})
    state.set_run_state(RUN, "training")
    spec = spec_of(infos, "L0", EAST, zone="us-east-1a")
    detail = {"spec": spec.to_json(), "placements": placements}
    state.put_instance(InstanceRecord(RUN, "L0", "east", "aws", "learner", "running", "", time.time(), detail))
    return state, Controller(RUN, state, owners={"aws": provider})


def failures(state: State) -> list[tuple[str, str]]:
    return [(e["error"], e["code"]) for e in state.events(RUN, 100) if e.get("kind") == "provision-failed"]


ZONE_A, ZONE_B = ({"provider": "aws", "cloud_region": "us-east-1", "zone": z} for z in ("us-east-1a", "us-east-1b"))
WEST_REGION = {"provider": "aws", "cloud_region": "eu-west-1", "zone": ""}


def test_failover_capacity_moves_zone_quota_moves_region_each_with_its_reason(booted: AwsCloud, tmp_path: Path) -> None:
    state, controller = controller_world(tmp_path, [ZONE_A, ZONE_B, WEST_REGION])
    booted.fail("RunInstances", "InsufficientInstanceCapacity", zone="us-east-1a")
    booted.fail("RunInstances", "MaxSpotInstanceCountExceeded", region="us-east-1", zone="us-east-1b")
    controller.once(now=0.0)  # zone a: no capacity for either type
    controller.once(now=1.0)  # zone b: the region's spot quota
    controller.once(now=2.0)  # eu-west-1, prepared on first use
    assert failures(state) == [
        ("capacity", "InsufficientInstanceCapacity"),
        ("quota", "MaxSpotInstanceCountExceeded"),
    ]
    zones = [c.zone for c in booted.calls("RunInstances")]
    assert (
        zones[:2] == ["us-east-1a", "us-east-1a"]
        and zones[2] == "us-east-1b"
        and booted.calls("RunInstances")[-1].region == "eu-west-1"
    )
    (vm,) = AwsProvider().list_run(RUN)
    assert vm.provider_id.startswith("eu-west-1/") and vm.alive
    reasons = [e["reason"] for e in state.events(RUN, 100) if e.get("kind") == "replaced"]
    assert reasons and reasons[-1].endswith("us-east-1/us-east-1a, us-east-1/us-east-1b blocked, trying eu-west-1")


def test_throttling_is_retried_bad_credentials_stop_the_cloud_naming_the_profile(booted: AwsCloud, tmp_path: Path) -> None:
    booted.fail("DescribeVpcs", "RequestLimitExceeded", times=2)
    AwsProvider().bootstrap("throttled", [EAST], "east")  # standard mode: two throttled answers, then through
    assert [c.status for c in booted.calls("DescribeVpcs")][:3] == [503, 503, 200]

    state, controller = controller_world(tmp_path, [ZONE_A, ZONE_B])
    booted.fail("RunInstances", "RequestLimitExceeded", times=1)
    controller.once(now=0.0)
    assert controller.once(now=1.0)[0].kind == "wait"  # backing off
    controller.once(now=100.0)
    assert failures(state) == [("transient", "RequestLimitExceeded")] and len(AwsProvider().list_run(RUN)) == 1

    with pytest.raises(ProvisionError, match="profile 'nightly'") as missing:
        AwsProvider(Clients(profile="nightly")).bootstrap(RUN, [EAST], "east")
    assert missing.value.kind == "credentials"
    booted.fail("RunInstances", "AuthFailure")
    state, controller = controller_world(tmp_path / "2", [ZONE_A, ZONE_B])
    AwsProvider().retire(AwsProvider().list_run(RUN)[0], tmp_path / "log")
    controller.once(now=0.0)
    assert controller.once(now=1.0)[0].kind == "give_up"  # credentials block the whole cloud: no zone is tried again
    assert failures(state) == [("credentials", "AuthFailure")]
    assert len([c for c in booted.calls("RunInstances") if c.status == 401]) == 1


def test_down_leaves_nothing_and_orphans_are_swept_by_tag(booted: AwsCloud) -> None:
    provider = AwsProvider()
    infos = provider.bootstrap(RUN, [EAST, WEST], "east")
    provider.create(spec_of(infos, "syncer", EAST, role="syncer"))
    provider.create(spec_of(infos, "L0", WEST))
    for instance in provider.list_run(RUN):
        provider.terminate(instance, grace_s=0.0)
    removed = provider.cleanup(RUN)
    assert {kind for kind, _ in removed} >= {"elastic ip", "key pair", "security group"}
    for region in ("us-east-1", "eu-west-1"):
        ec2 = booted.client("ec2", region)
        assert groups(booted, region) == [] and ec2.describe_addresses()["Addresses"] == []
        assert ec2.describe_key_pairs()["KeyPairs"] == []
        live = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"] if i["State"]["Name"] != "terminated"]
        assert live == []

    # two runs left behind by another laptop: one still training (its syncer runs), one whose syncer is gone
    for run in ("alive", "dead"):
        other = AwsProvider()
        got = other.bootstrap(run, [EAST], "east")
        for name, role in [("syncer", "syncer")] * (run == "alive") + [("L0", "learner")]:
            log = RunDir(run).log(name)
            machine = got["east"].machine
            other.create(
                InstanceSpec(
                    run=run, name=name, region="east", role=role, argv=("x",), log=log, cloud_region="us-east-1", machine=machine
                )
            )
    swept = AwsProvider().sweep([EAST, WEST], live=set(), now=time.time())
    kinds = {(kind, name.split("/")[1] if kind == "instance" else "") for kind, name in swept}
    assert ("instance", "dead") in kinds and ("instance", "alive") not in kinds
    ec2 = booted.client("ec2", "us-east-1")
    left = {
        tag["Value"]
        for r in ec2.describe_instances()["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
        for tag in i["Tags"]
        if tag["Key"] == "ddctl-run"
    }
    assert left == {"alive"}
    assert {
        t["Value"] for g in ec2.describe_security_groups()["SecurityGroups"] for t in g.get("Tags", []) if t["Key"] == "ddctl-run"
    } == {"alive"}
    expired = AwsProvider().sweep([EAST], live={"alive"}, now=time.time() + 8 * 24 * 3600)  # a week on: past ddctl-expires-at
    assert sum(1 for kind, _ in expired if kind == "instance") == 2


def test_a_partition_closes_the_syncer_port_to_one_regions_learners_and_healing_reopens_it(booted: AwsCloud) -> None:
    provider = AwsProvider()
    infos = provider.bootstrap(RUN, [EAST, WEST], "east")
    provider.create(spec_of(infos, "syncer", EAST, role="syncer"))
    east = provider.create(spec_of(infos, "L0", EAST))
    west = provider.create(spec_of(infos, "L1", WEST))
    (group,) = groups(booted, "us-east-1")  # the syncer's region holds every learner's rule
    assert port_sources(group, SYNCER_PORT) == {OPERATOR, f"{east.address}/32", f"{west.address}/32"}
    provider.cut_link(RUN, "west")
    assert port_sources(groups(booted, "us-east-1")[0], SYNCER_PORT) == {OPERATOR, f"{east.address}/32"}
    provider.heal_link(RUN, "west")
    assert port_sources(groups(booted, "us-east-1")[0], SYNCER_PORT) == {OPERATOR, f"{east.address}/32", f"{west.address}/32"}


def test_down_orphans_sweeps_the_files_regions_and_reports_what_went(booted: AwsCloud, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ddctl.cli.app import app

    provider = AwsProvider()
    infos = provider.bootstrap("forgotten", [WEST], "west")
    machine = infos["west"].machine
    log = RunDir("forgotten").log("L0")
    provider.create(InstanceSpec(run="forgotten", name="L0", region="west", role="learner", argv=("x",), log=log,
                                 cloud_region="eu-west-1", machine=machine))  # fmt: skip
    regions = tmp_path / "aws.yaml"
    regions.write_text(
        "run: other\nsyncer: west\nregions:\n"
        f"  - {{name: west, provider: aws, cloud_region: eu-west-1, instance_type: g5.xlarge, image: {IMAGE}}}\n"
    )
    swept = CliRunner().invoke(app, ["down", "--orphans", "-f", str(regions), "--json"])
    assert swept.exit_code == 0, swept.output
    removed = json.loads(swept.stdout)["removed"]
    assert [name.split("/")[1] for name in removed["instance"]] == ["forgotten"]
    assert {"security group", "key pair", "elastic ip"} <= set(removed)
    again = CliRunner().invoke(app, ["down", "--orphans", "-f", str(regions), "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["removed"] == {}


def test_an_instance_without_its_pinned_host_key_is_never_connected_to(booted: AwsCloud) -> None:
    provider = AwsProvider()
    infos = provider.bootstrap(RUN, [EAST], "east")
    made = provider.create(spec_of(infos, "L0", EAST))
    ident = made.provider_id.split("/")[1]
    ec2 = booted.client("ec2", "us-east-1")
    ec2.create_tags(Resources=[ident], Tags=[{"Key": "ddctl-host-key", "Value": "ssh-rsa AAAA-someone-elses"}])
    with pytest.raises(DdctlError, match="no ddctl-host-key tag ddctl could pin"):
        provider.ssh_target(made)
    ec2.delete_tags(Resources=[ident], Tags=[{"Key": "ddctl-host-key"}])
    with pytest.raises(DdctlError, match="no ddctl-host-key tag"):
        provider.ssh_target(made)
    assert provider.read_file(made, "/opt/ddctl/summary.json") is None  # nothing read, nothing crashed
