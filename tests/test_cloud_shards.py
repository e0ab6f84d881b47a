"""Shards of a sharded synchronizer on cloud VMs: each behind an address reserved for it in its own region, every
region told every shard's address, the syncer's port opened on each shard's firewall, and ``down`` releasing them all.

AWS against moto's real HTTP server, GCP against the fake Compute REST API; no VM boots here
(``tests/test_cloud_shards_e2e.py`` trains a sharded job on the test hypervisor's VMs).
"""

from __future__ import annotations

import dataclasses

import pytest

from aws_cloud import AwsCloud
from builders import machines_that_would_answer
from ddctl.config.regions import Region
from ddctl.control.rundir import RunDir
from ddctl.errors import DdctlError
from ddctl.providers.aws import provider as aws_provider
from ddctl.providers.aws.provider import SYNCER_PORT, AwsProvider
from ddctl.providers.base import InstanceSpec, RegionInfo, joined_shard_hosts
from ddctl.providers.gcp import network as gcp_network
from ddctl.providers.gcp import provider as gcp_provider
from ddctl.providers.gcp.provider import GcpProvider
from gcp_cloud import GcpCloud

RUN = "r1"
OPERATOR = "100.100.0.1/32"  # DDCTL_SSH_FROM in the fixtures
IMAGE = "ami-12c6146b"
EAST = Region(name="east", provider="aws", cloud_region="us-east-1", instance_type="g5.xlarge", image=IMAGE, python="python3")
WEST = Region(name="west", provider="aws", cloud_region="eu-west-1", instance_type="g5.xlarge", image=IMAGE, python="python3")
IOWA = Region(name="iowa", provider="gcp", cloud_region="us-central1", instance_type="g2-standard-4", python="python3")
NL = Region(name="nl", provider="gcp", cloud_region="europe-west4", instance_type="g2-standard-4")


def spec_of(infos: dict[str, RegionInfo], name: str, region: Region, role: str = "learner") -> InstanceSpec:
    return InstanceSpec(
        run=RUN, name=name, region=region.name, role=role, argv=("python3", "-m", "agent"), log=RunDir(RUN).log(name),
        cloud_region=region.cloud_region, machine=infos[region.name].machine,
    )  # fmt: skip


def eips(aws: AwsCloud, region: str) -> dict[str, str]:
    """Name tag -> public address of the run's Elastic IPs in ``region``."""
    found = aws.client("ec2", region).describe_addresses()["Addresses"]
    return {next(t["Value"] for t in a.get("Tags", []) if t["Key"] == "ddctl-name"): a["PublicIp"] for a in found}


def syncer_port_sources(aws: AwsCloud, region: str) -> set[str]:
    (group,) = aws.client("ec2", region).describe_security_groups(Filters=[{"Name": "tag:ddctl-run", "Values": [RUN]}])[
        "SecurityGroups"
    ]
    return {r["CidrIp"] for p in group["IpPermissions"] if p.get("FromPort") == SYNCER_PORT for r in p.get("IpRanges", [])}


def test_aws_reserves_an_elastic_ip_per_shard_in_its_region_and_every_region_is_told_all_of_them(aws: AwsCloud) -> None:
    infos = AwsProvider().bootstrap(RUN, [EAST, WEST], "east", shard_regions=("east", "west", "east"))
    assert AwsProvider().bootstrap(RUN, [EAST, WEST], "east", shard_regions=("east", "west", "east")) == infos  # idempotent
    east, west = eips(aws, "us-east-1"), eips(aws, "eu-west-1")
    assert sorted(east) == ["syncer", "syncer-s2"] and sorted(west) == ["syncer-s1"]  # each where the plan put it
    hosts = (east["syncer"], west["syncer-s1"], east["syncer-s2"])
    assert len(set(hosts)) == 3
    for info in infos.values():
        assert info.shard_hosts == hosts and info.syncer_host == hosts[0]
        assert [info.shard_host(i) for i in range(3)] == list(hosts)
        assert info.machine["syncer_regions"] == ["eu-west-1", "us-east-1"]  # a learner's port opens in both
    single = AwsProvider().bootstrap("solo", [EAST], "east")  # one synchronizer: one address, no shard table
    assert single["east"].shard_hosts == () and single["east"].shard_host(0) == single["east"].syncer_host


def test_aws_each_shard_vm_comes_up_at_its_own_address_and_its_port_follows_the_learners(
    aws: AwsCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    machines_that_would_answer(monkeypatch, aws_provider)
    provider = AwsProvider()
    infos = provider.bootstrap(RUN, [EAST, WEST], "east", shard_regions=("east", "west"))
    s0 = provider.create(spec_of(infos, "syncer", EAST, role="syncer"))
    s1 = provider.create(spec_of(infos, "syncer-s1", WEST, role="syncer"))
    assert (s0.address, s1.address) == infos["east"].shard_hosts  # associated with the shard's own Elastic IP
    assert s1.provider_id.startswith("eu-west-1/")
    learner = provider.create(spec_of(infos, "L0", EAST))
    for region in ("us-east-1", "eu-west-1"):  # the new learner reaches both shards
        assert syncer_port_sources(aws, region) == {OPERATOR, f"{learner.address}/32"}

    provider.admit(RUN, {"L0": learner.address, "L7": "100.100.7.7"})  # the controller's exact set, on every shard's group
    for region in ("us-east-1", "eu-west-1"):
        assert syncer_port_sources(aws, region) == {OPERATOR, f"{learner.address}/32", "100.100.7.7/32"}
    provider.cut_link(RUN, "east")  # a partition of east cuts it off from both shards
    assert all(f"{learner.address}/32" not in syncer_port_sources(aws, r) for r in ("us-east-1", "eu-west-1"))
    provider.heal_link(RUN, "east")
    assert all(f"{learner.address}/32" in syncer_port_sources(aws, r) for r in ("us-east-1", "eu-west-1"))

    for instance in provider.list_run(RUN):
        provider.retire(instance, RunDir(RUN).log(instance.name))
    removed = provider.cleanup(RUN)
    assert sorted(what for kind, what in removed if kind == "elastic ip") == sorted(
        [f"us-east-1/{s0.address}", f"eu-west-1/{s1.address}"]
    )
    assert eips(aws, "us-east-1") == eips(aws, "eu-west-1") == {}
    with pytest.raises(DdctlError, match="no running syncer on aws"):  # nothing left to cut
        provider.cut_link(RUN, "east")


def test_a_learner_spec_an_older_ddctl_stored_still_opens_its_syncers_port(
    aws: AwsCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started before shards ran on clouds: its stored learner specs name one ``syncer_region``."""
    machines_that_would_answer(monkeypatch, aws_provider)
    provider = AwsProvider()
    infos = provider.bootstrap(RUN, [EAST], "east")
    older = {k: v for k, v in infos["east"].machine.items() if k != "syncer_regions"} | {"syncer_region": "us-east-1"}
    learner = provider.create(dataclasses.replace(spec_of(infos, "L0", EAST), machine=older))
    assert syncer_port_sources(aws, "us-east-1") == {OPERATOR, f"{learner.address}/32"}


def test_gcp_reserves_an_address_per_shard_in_its_region_and_down_releases_every_one(
    gcp: GcpCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    machines_that_would_answer(monkeypatch, gcp_provider)
    provider = GcpProvider()
    infos = provider.bootstrap(RUN, [IOWA, NL], "iowa", shard_regions=("iowa", "nl"))
    assert GcpProvider().bootstrap(RUN, [IOWA, NL], "iowa", shard_regions=("iowa", "nl")) == infos
    reserved = {a["name"]: (a["region"].rsplit("/", 1)[1], a["address"]) for a in gcp.addresses()}
    assert reserved == {
        "ddctl-r1-syncer": ("us-central1", infos["iowa"].shard_hosts[0]),
        "ddctl-r1-syncer-s1": ("europe-west4", infos["iowa"].shard_hosts[1]),
    }
    assert infos["nl"].shard_hosts == infos["iowa"].shard_hosts and infos["nl"].syncer_host == infos["iowa"].shard_hosts[0]
    s1 = provider.create(spec_of(infos, "syncer-s1", NL, role="syncer"))
    assert s1.address == infos["nl"].shard_hosts[1]  # the VM is at the address reserved for its shard
    other = gcp_network.ensure_address(provider.clients, "ddctl-test", "europe-west4", "r10")  # another run's, beside them
    for instance in provider.list_run(RUN):
        provider.retire(instance, RunDir(RUN).log(instance.name))
    removed = provider.cleanup(RUN)
    assert sorted(what for kind, what in removed if kind == "address") == [
        "ddctl-test/europe-west4/ddctl-r1-syncer-s1",
        "ddctl-test/us-central1/ddctl-r1-syncer",
    ]
    assert [(a["name"], a["address"]) for a in gcp.addresses()] == [("ddctl-r10-syncer", other)]  # the other run's stays


def test_a_gcp_address_belongs_to_a_run_only_by_its_exact_name() -> None:
    assert gcp_network.is_address_of("r1", "ddctl-r1-syncer") and gcp_network.is_address_of("r1", "ddctl-r1-syncer-s12")
    for other in ("ddctl-r1-syncer-sx", "ddctl-r1-syncer-s", "ddctl-r10-syncer", "ddctl-r1-ssh", "ddctl-r1-syncer-s1-x"):
        assert not gcp_network.is_address_of("r1", other), other


def info(region: str, provider: str, hosts: tuple[str, ...] = (), remote: bool = True) -> RegionInfo:
    return RegionInfo(region=region, provider=provider, python="python3", remote=remote, syncer_host="9.9.9.9", shard_hosts=hosts)


def test_every_region_learns_every_cloud_shards_address_whichever_cloud_reserved_it() -> None:
    infos = {
        "east": info("east", "aws", ("100.100.0.10", "")),  # aws reserved shard 0's; shard 1 is gcp's
        "iowa": info("iowa", "gcp", ("", "100.100.64.3")),
        "laptop": info("laptop", "process", remote=False),  # a learner on this machine reaches both too
    }
    joined = joined_shard_hosts(infos, ("east", "iowa"))
    assert {name: i.shard_hosts for name, i in joined.items()} == dict.fromkeys(infos, ("100.100.0.10", "100.100.64.3"))
    assert joined["laptop"].shard_host(1) == "100.100.64.3"
    docker = RegionInfo(region="a", provider="docker", python="p", remote=True, syncer_host="10.1.0.250", shard_addresses=True)
    local = {"a": docker}
    assert joined_shard_hosts(local, ("a", "a")) == local and local["a"].shard_host(1) == "10.1.0.249"  # Docker's own rule
    assert joined_shard_hosts(infos, ()) == infos  # one synchronizer: nothing to join
