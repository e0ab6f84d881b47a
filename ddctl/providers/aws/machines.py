"""What one EC2 instance is asked to be: its ``RunInstances`` request, user data and tags (pure).

The request is built here and nowhere else, so a test reads exactly what EC2
is sent. A learner is spot (one-time, terminated on interruption), the syncer
on-demand; both terminate when their OS shuts down, so the agent's exit (its
dead-man too) powers the VM off for good. IMDSv2 is required (no token, no
metadata). The user data is the shared first-boot script (``firstboot.py``), which cloud-init
runs as root.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ddctl.errors import DdctlError
from ddctl.providers.aws.answers import paged, records
from ddctl.providers.base import NAME_LABEL, RUN_LABEL, InstanceSpec, ipv4
from ddctl.providers.firstboot import DEFAULT_PYTHON

INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
"""What EC2 names an instance: checked before an answered id goes into the state or the footprint's files."""

if TYPE_CHECKING:
    from ddctl.config.regions import Region

ROLE_TAG = "ddctl-role"
REGION_TAG = "ddctl-region"
HOST_KEY_TAG = "ddctl-host-key"
EXPIRES_TAG = "ddctl-expires-at"
DEFAULT_IMAGE_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
"""A public SSM parameter naming the current Deep Learning Base AMI (NVIDIA driver, CUDA, Ubuntu 22.04)."""
LIVE_STATES = ("pending", "running")


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """How a region's VMs are made: from regions.yaml, carried in each instance's spec."""

    image: str
    python: str
    spot: bool
    max_price: float | None = None


def tags(spec: InstanceSpec, host_key: str, expires_at: float) -> dict[str, str]:
    """The labels that make the instance findable (and removable) with the local state gone."""
    return {
        RUN_LABEL: spec.run,
        NAME_LABEL: spec.name,
        ROLE_TAG: spec.role,
        REGION_TAG: spec.region,
        HOST_KEY_TAG: host_key,
        EXPIRES_TAG: datetime.fromtimestamp(expires_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "Name": f"ddctl-{spec.run}-{spec.name}",
    }


def launch_request(
    spec: InstanceSpec,
    machine: Machine,
    *,
    instance_type: str,
    subnet: str,
    security_group: str,
    key_name: str,
    user_data: str,
    tags: dict[str, str],
) -> dict[str, Any]:
    """The ``RunInstances`` keyword arguments for ``spec`` on ``machine`` in ``subnet``."""
    tag_list = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
    request: dict[str, Any] = {
        "ImageId": machine.image,
        "InstanceType": instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "KeyName": key_name,
        "UserData": user_data,
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
        "NetworkInterfaces": [
            {"DeviceIndex": 0, "SubnetId": subnet, "Groups": [security_group], "AssociatePublicIpAddress": True}
        ],
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tag_list}, {"ResourceType": "volume", "Tags": tag_list}],
    }
    if machine.spot:
        options: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if machine.max_price is not None:
            options["MaxPrice"] = f"{machine.max_price:.4f}"
        request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
    return request


def tag_map(raw: dict[str, Any]) -> dict[str, str]:
    """An EC2 description's ``Tags`` list as a dict."""
    return {str(t.get("Key")): str(t.get("Value")) for t in raw.get("Tags") or [] if isinstance(t, dict)}


def machine_settings(region: Region, syncer_regions: list[str], ssh_from: str) -> dict[str, Any]:
    """What ``create`` needs to know of a region, carried in each of its instances' specs (``syncer_regions``: the
    cloud regions of EC2 whose synchronizer VMs, the syncer or its shards, open their port to a new learner)."""
    return {
        "instance_types": list(region.types),
        "image": region.image,
        "python": region.python or DEFAULT_PYTHON,
        "spot": region.spot,
        "max_price": region.price_cap,
        "vpc": region.vpc,
        "syncer_regions": syncer_regions,
        "ssh_from": ssh_from,
    }


def public_address(raw: dict[str, Any]) -> str | None:
    """The instance's public IPv4 address as EC2 described it, if it is one (it becomes an SSH host and a /32 rule)."""
    return ipv4(raw.get("PublicIpAddress"))


def private_address(raw: dict[str, Any]) -> str:
    """The instance's private IPv4 address as EC2 described it ("" if it is none): where its region's peers reach it
    (a learner's nodes meet at its first node's, torchrun's c10d)."""
    return ipv4(raw.get("PrivateIpAddress")) or ""


def described(raw: object) -> bool:
    """Whether an instance EC2 described has the shape the provider reads (an id, a state, a placement): one that
    has not is logged and skipped, not a KeyError out of the controller's loop."""
    ok = (
        isinstance(raw, dict)
        and isinstance(raw.get("InstanceId"), str)
        and INSTANCE_ID.fullmatch(raw["InstanceId"]) is not None
        and isinstance(raw.get("State"), dict)
        and isinstance(raw["State"].get("Name"), str)
        and isinstance(raw.get("Placement", {}), dict)
    )
    if not ok:
        logging.getLogger(__name__).warning("EC2 described an instance of another shape: skipped (%.200r)", raw)
    return ok


def instances_of(pages: Iterable[object]) -> list[dict[str, Any]]:
    """The instances over ``describe_instances``' pages that have the shape read here (one without a state or an
    id is logged and left alone: never guessed at, never deleted)."""
    reservations = paged(pages, "Reservations", "DescribeInstances")
    return [i for r in reservations for i in records(r, "Instances", "DescribeInstances") if described(i)]


def instance_id(answered: object) -> str:
    """The id ``run_instances`` answered, if it looks like one: it goes into the state and the footprint's files."""
    if not (isinstance(answered, str) and INSTANCE_ID.fullmatch(answered)):
        raise DdctlError(f"EC2 answered an instance id that is none: {str(answered)[:60]!r}")
    return answered
