"""A region's network for a run: VPC and subnets, the run's security group, key pair and Elastic IP.

Every call is idempotent and finds what it made by name or tag, so a failover
region is prepared on first use and a second ``up`` changes nothing. The
security group lets SSH and the syncer's port in from the laptop's address,
the syncer's port from the run's learners: one /32 rule per learner, added when it
starts and revoked when it goes, and every TCP port from its own members, so the
nodes of a learner meet (torchrun's c10d, NCCL, gloo) over the region's private
network. The syncer's Elastic IP (one per shard of a sharded synchronizer, tagged
with its name) is allocated before the syncer exists, so the address goes into
the job's certificate and every learner's URL, and a replacement syncer comes
back at the same address.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from ddctl.errors import ProvisionError
from ddctl.providers.aws.answers import named, records
from ddctl.providers.aws.machines import tag_map
from ddctl.providers.base import NAME_LABEL, RUN_LABEL, answered_ipv4, ipv4

DUPLICATES = ("InvalidPermission.Duplicate", "InvalidKeyPair.Duplicate", "InvalidGroup.Duplicate")
GONE = ("InvalidPermission.NotFound", "InvalidGroup.NotFound", "InvalidKeyPair.NotFound", "InvalidAllocationID.NotFound")


def run_name(run: str) -> str:
    """The name of the run's security group and key pair in every region."""
    return f"ddctl-{run}"


def run_filter(run: str) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{RUN_LABEL}", "Values": [run]}]


def tagged(kind: str, run: str, **extra: str) -> list[dict[str, Any]]:
    tags = [
        {"Key": RUN_LABEL, "Value": run},
        {"Key": "Name", "Value": run_name(run)},
        *({"Key": k, "Value": v} for k, v in extra.items()),
    ]
    return [{"ResourceType": kind, "Tags": tags}]


def code_of(error: Exception) -> str:
    response = getattr(error, "response", None)
    return str((response or {}).get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


@dataclass(frozen=True, slots=True)
class Network:
    """What instances of a run in one cloud region are created into."""

    region: str
    vpc: str
    subnets: dict[str, str]
    """Zone -> the subnet instances of that zone go into."""
    security_group: str
    key_name: str


def find_vpc(ec2: Any, region: str, vpc: str) -> str:
    """The VPC the file names (an id or a Name tag), or the region's default VPC."""
    if vpc.startswith("vpc-"):
        answer = ec2.describe_vpcs(VpcIds=[vpc])
    elif vpc:
        answer = ec2.describe_vpcs(Filters=[{"Name": "tag:Name", "Values": [vpc]}])
    else:
        answer = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])
    found = records(answer, "Vpcs", "DescribeVpcs")
    if not found:
        what = f"no VPC named {vpc!r}" if vpc else "no default VPC"
        raise ProvisionError(
            f"aws {region}: {what}; name one with `vpc:` (an id or its Name tag)", kind="config", scope="region", region=region,
            provider="aws", code="NoVpc",
        )  # fmt: skip
    return named(found[0], "VpcId", "DescribeVpcs")


def zone_subnets(ec2: Any, vpc: str) -> dict[str, str]:
    """One subnet per zone, preferring those that give public addresses (the learners reach the syncer's)."""
    call = "DescribeSubnets"
    subnets = [
        (
            named(s, "AvailabilityZone", call),
            named(s, "SubnetId", call),
            s.get("MapPublicIpOnLaunch") is True,
            s.get("DefaultForAz") is True,
        )
        for s in records(ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}]), "Subnets", call)
    ]
    chosen: dict[str, str] = {}
    for zone, subnet, _, _ in sorted(subnets, key=lambda s: (not s[2], not s[3], s[1])):
        chosen.setdefault(zone, subnet)
    return dict(sorted(chosen.items()))


def ensure_security_group(ec2: Any, run: str, vpc: str, ssh_from: str, syncer_port: int) -> str:
    """The run's security group in ``vpc``: SSH and the syncer's port open to the operator (``ssh_from``, a CIDR) only,
    every TCP port to the group's own members."""
    found = ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [run_name(run)]}, {"Name": "vpc-id", "Values": [vpc]}]
    )
    groups = [named(g, "GroupId", "DescribeSecurityGroups") for g in records(found, "SecurityGroups", "DescribeSecurityGroups")]
    if groups:
        group = groups[0]
    else:
        made = ec2.create_security_group(
            GroupName=run_name(run),
            Description=f"ddctl run {run}: SSH from the operator, the syncer port from the run's learners",
            VpcId=vpc,
            TagSpecifications=tagged("security-group", run),
        )
        group = named(made if isinstance(made, dict) else {}, "GroupId", "CreateSecurityGroup")
    allow(ec2, group, 22, ssh_from, "ssh from the operator")
    allow(ec2, group, syncer_port, ssh_from, "status and admin from the operator")
    allow_members(ec2, group)
    return group


def allow(ec2: Any, group: str, port: int, cidr: str, why: str) -> None:
    """Open ``port`` to ``cidr`` (already open: fine)."""
    rule = {"IpProtocol": "tcp", "FromPort": port, "ToPort": port, "IpRanges": [{"CidrIp": cidr, "Description": why}]}
    _authorize(ec2, group, rule)


def allow_members(ec2: Any, group: str) -> None:
    """Open every TCP port to the group's own members (the source is the group): the run's VMs of one region reach
    each other on the ports their ranks pick, and nothing else does (already open: fine)."""
    pair = {"GroupId": group, "Description": "any TCP port between the VMs of the run"}
    _authorize(ec2, group, {"IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535, "UserIdGroupPairs": [pair]})


def _authorize(ec2: Any, group: str, rule: dict[str, Any]) -> None:
    try:
        ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[rule])
    except Exception as exc:
        if code_of(exc) not in DUPLICATES:
            raise


def revoke(ec2: Any, group: str, port: int, cidr: str) -> None:
    """Close ``port`` to ``cidr`` (already closed: fine)."""
    rule = {"IpProtocol": "tcp", "FromPort": port, "ToPort": port, "IpRanges": [{"CidrIp": cidr}]}
    try:
        ec2.revoke_security_group_ingress(GroupId=group, IpPermissions=[rule])
    except Exception as exc:
        if code_of(exc) not in GONE:
            raise


def opened(ec2: Any, group: str, port: int) -> set[str]:
    """The CIDRs ``port`` is open to."""
    call = "DescribeSecurityGroups"
    groups = records(ec2.describe_security_groups(GroupIds=[group]), "SecurityGroups", call)
    rules = [p for g in groups for p in records(g, "IpPermissions", call) if p.get("FromPort") == port]
    return {named(r, "CidrIp", call) for p in rules for r in records(p, "IpRanges", call)}


def run_groups(ec2: Any, run: str) -> list[str]:
    """The ids of the run's security groups in ``ec2``'s region."""
    found = ec2.describe_security_groups(Filters=run_filter(run))
    return [named(g, "GroupId", "DescribeSecurityGroups") for g in records(found, "SecurityGroups", "DescribeSecurityGroups")]


def admit(ec2: Any, group: str, port: int, wanted: set[str], keep: set[str]) -> None:
    """Make ``port``'s /32 rules exactly ``wanted`` (CIDRs), besides those in ``keep`` (the operator's)."""
    current = opened(ec2, group, port)
    for cidr in sorted(current - wanted - keep):
        if cidr.endswith("/32"):
            revoke(ec2, group, port, cidr)
    for cidr in sorted(wanted - current):
        allow(ec2, group, port, cidr, "a learner of the run")


def ensure_key_pair(ec2: Any, run: str, public_line: str) -> str:
    """The run's client key imported as a key pair (EC2 wants one named; the user data installs it too)."""
    try:
        ec2.import_key_pair(
            KeyName=run_name(run), PublicKeyMaterial=public_line.encode(), TagSpecifications=tagged("key-pair", run)
        )
    except Exception as exc:
        if code_of(exc) not in DUPLICATES:
            raise
    return run_name(run)


def ensure_address(ec2: Any, run: str, name: str = "syncer") -> tuple[str, str]:
    """The run's Elastic IP in this region for the synchronizer instance ``name`` (``syncer``, or a shard's
    ``syncer-s1``, ...), tagged with it: (allocation id, public address)."""
    for address in records(ec2.describe_addresses(Filters=run_filter(run)), "Addresses", "DescribeAddresses"):
        if tag_map(address).get(NAME_LABEL, "syncer") == name:  # untagged: the syncer's (an older ddctl's)
            ip = answered_ipv4(address.get("PublicIp"), f"EC2's Elastic IP of {name}")
            return named(address, "AllocationId", "DescribeAddresses"), ip
    made = ec2.allocate_address(Domain="vpc", TagSpecifications=tagged("elastic-ip", run, **{NAME_LABEL: name}))
    made = made if isinstance(made, dict) else {}
    ip = answered_ipv4(made.get("PublicIp"), f"EC2's new Elastic IP of {name}")
    return named(made, "AllocationId", "AllocateAddress"), ip


def remove_network(ec2: Any, run: str, wait_s: float = 120.0) -> list[tuple[str, str]]:
    """Release the run's address, delete its key pair and security group (once its instances are gone)."""
    removed: list[tuple[str, str]] = []
    for address in records(ec2.describe_addresses(Filters=run_filter(run)), "Addresses", "DescribeAddresses"):
        allocation = named(address, "AllocationId", "DescribeAddresses")
        with contextlib.suppress(Exception):
            if address.get("AssociationId"):
                ec2.disassociate_address(AssociationId=named(address, "AssociationId", "DescribeAddresses"))
        ec2.release_address(AllocationId=allocation)
        shown = ipv4(address.get("PublicIp")) or allocation
        removed.append(("elastic ip", f"{ec2.meta.region_name}/{shown}"))
    try:
        pairs = records(ec2.describe_key_pairs(KeyNames=[run_name(run)]), "KeyPairs", "DescribeKeyPairs")
    except Exception as exc:
        if code_of(exc) not in GONE:
            raise
        pairs = []
    for key in [named(pair, "KeyName", "DescribeKeyPairs") for pair in pairs]:
        ec2.delete_key_pair(KeyName=key)
        removed.append(("key pair", f"{ec2.meta.region_name}/{key}"))
    for group in run_groups(ec2, run):
        deadline = time.monotonic() + wait_s
        while True:  # a group is in use until the instances in it have terminated
            try:
                ec2.delete_security_group(GroupId=group)
                break
            except Exception as exc:
                if code_of(exc) in GONE:
                    break
                if code_of(exc) != "DependencyViolation" or time.monotonic() > deadline:
                    raise
                time.sleep(2.0)
        removed.append(("security group", f"{ec2.meta.region_name}/{group}"))
    return removed
