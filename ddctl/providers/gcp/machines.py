"""What one Compute Engine instance is asked to be, and what ddctl reads back from one (pure).

The ``instances.insert`` body is built here as the JSON GCE is sent, so a test
reads exactly that. A learner is SPOT, deleted when preempted
(``instanceTerminationAction: DELETE``) and never migrated; the syncer is
standard and keeps its reserved address. GCE labels are lowercase and at most
63 characters, so a run's and an instance's names are labels for *finding*
only; the exact names, the pinned host key and the first-boot script
(``firstboot.py``, as GCE's ``startup-script``) travel in the metadata. What
comes back from the API is checked before it is used: an address must be an
IPv4 address, a host key an ed25519 line.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddctl.providers import deploy
from ddctl.providers.base import NAME_LABEL, RUN_LABEL, InstanceSpec, ipv4
from ddctl.providers.firstboot import DEFAULT_PYTHON

if TYPE_CHECKING:
    from ddctl.config.regions import Region

ROLE_LABEL = "ddctl-role"
REGION_LABEL = "ddctl-region"
EXPIRES_LABEL = "ddctl-expires-at"
HOST_KEY_ITEM = "ddctl-host-key"
DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11-py310"
"""Google's Deep Learning VM image family (NVIDIA driver, CUDA 12.4, Debian 11)."""
DEFAULT_NETWORK = "default"
LIVE_STATES = ("PROVISIONING", "STAGING", "RUNNING")
ATTACHED_GPU_FAMILIES = ("n1-",)
"""Machine families whose GPUs are attached as ``guestAccelerators``; g2, a2 and a3 types come with theirs."""
BUILT_IN_GPU_FAMILIES = ("g2-", "g4-", "a2-", "a3-", "a4-")
"""Machine families that come with GPUs (which cannot live-migrate: GCE refuses MIGRATE for them)."""


def label(text: str) -> str:
    """``text`` as a GCE label value: lowercase letters, digits, ``-`` and ``_``, at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def resource_name(*parts: str) -> str:
    """A GCE resource name (``[a-z]([-a-z0-9]*[a-z0-9])?``, at most 63) made of ``parts``."""
    body = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")
    return ("ddctl-" + body.removeprefix("ddctl-"))[:63].rstrip("-")


def instance_name(spec: InstanceSpec) -> str:
    """Unique per incarnation (a replacement gets a new name); the suffix survives truncation."""
    return f"{resource_name(spec.run, spec.name)[:56].rstrip('-')}-{secrets.token_hex(3)}"


def run_tag(run: str) -> str:
    """The network tag every VM of the run carries (the SSH and internal rules target it; the internal rule admits it)."""
    return resource_name(run)


def syncer_tag(run: str) -> str:
    """The network tag of the run's syncer (the syncer-port rule targets it)."""
    return resource_name(run, "syncer")


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """How a region's VMs are made: from regions.yaml, carried in each instance's spec."""

    project: str
    image: str
    python: str
    spot: bool
    network: str
    disk_gb: int
    accelerator: str = ""
    accelerator_count: int = 1


def labels(spec: InstanceSpec, expires_at: float) -> dict[str, str]:
    """The labels that make the instance findable (and removable) with the local state gone."""
    return {
        RUN_LABEL: label(spec.run),
        NAME_LABEL: label(spec.name),
        ROLE_LABEL: label(spec.role),
        REGION_LABEL: label(spec.region),
        EXPIRES_LABEL: str(int(expires_at)),
    }


def insert_body(
    spec: InstanceSpec, machine: Machine, *, name: str, zone: str, machine_type: str, metadata: dict[str, str],
    expires_at: float, address: str = "",
) -> dict[str, Any]:  # fmt: skip
    """The ``instances.insert`` body (GCE's JSON) for ``spec`` on ``machine`` in ``zone``."""
    spot = machine.spot and spec.role == "learner"
    gpus = bool(machine.accelerator) or machine_type.startswith(BUILT_IN_GPU_FAMILIES)
    access: dict[str, Any] = {"type": "ONE_TO_ONE_NAT", "name": "External NAT"} | ({"natIP": address} if address else {})
    body: dict[str, Any] = {
        "name": name,
        "machineType": f"zones/{zone}/machineTypes/{machine_type}",
        "labels": labels(spec, expires_at),
        "tags": {"items": [run_tag(spec.run), *([syncer_tag(spec.run)] if spec.role == "syncer" else [])]},
        "metadata": {"items": [{"key": k, "value": v} for k, v in metadata.items()]},
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {"sourceImage": machine.image or DEFAULT_IMAGE, "diskSizeGb": str(machine.disk_gb)},
            }
        ],
        "networkInterfaces": [{"network": f"global/networks/{machine.network}", "accessConfigs": [access]}],
        "scheduling": (
            {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE", "onHostMaintenance": "TERMINATE",
             "automaticRestart": False}
            if spot
            else {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE" if gpus else "MIGRATE",
                  "automaticRestart": True}
        ),
    }  # fmt: skip
    if machine.accelerator and machine_type.startswith(ATTACHED_GPU_FAMILIES):
        accelerator = f"zones/{zone}/acceleratorTypes/{machine.accelerator}"
        body["guestAccelerators"] = [{"acceleratorType": accelerator, "acceleratorCount": machine.accelerator_count}]
    return body


def metadata_items(spec: InstanceSpec, host_public: str, client_public: str, startup_script: str) -> dict[str, str]:
    """The metadata: the first-boot script, the pinned host key, the run's key, the exact names."""
    return {
        "startup-script": startup_script,
        HOST_KEY_ITEM: host_public,
        "ssh-keys": f"root:{client_public}",
        "enable-oslogin": "FALSE",
        RUN_LABEL: spec.run,
        NAME_LABEL: spec.name,
        ROLE_LABEL: spec.role,
        REGION_LABEL: spec.region,
    }


def machine_settings(region: Region, project: str, ssh_from: str) -> dict[str, Any]:
    """What ``create`` needs to know of a region, carried in each of its instances' specs."""
    return {
        "project": project,
        "instance_types": list(region.types),
        "image": region.image,
        "python": region.python or DEFAULT_PYTHON,
        "spot": region.spot,
        "network": region.vpc or DEFAULT_NETWORK,
        "disk_gb": region.disk_gb,
        "accelerator": region.accelerator,
        "accelerator_count": region.accelerator_count,
        "zones": list(region.zones),
        "ssh_from": ssh_from,
    }


# -- what comes back ----------------------------------------------------------------------------
def items(raw: Any) -> dict[str, str]:
    """An instance's metadata items as a dict."""
    return {str(i.key): str(i.value) for i in raw.metadata.items}


def public_address(raw: Any) -> str | None:
    """The instance's external IPv4 address as GCE described it, if it is one (it becomes an SSH host and a rule)."""
    for nic in raw.network_interfaces:
        for access in nic.access_configs:
            if (address := ipv4(access.nat_i_p)) is not None:
                return address
    return None


def private_address(raw: Any) -> str:
    """The first interface's internal IPv4 address as GCE described it ("" if it is none): where the run's VMs of its
    region reach it (a learner's nodes meet at its first node's, torchrun's c10d)."""
    nics = list(raw.network_interfaces)
    return (ipv4(nics[0].network_i_p) if nics else None) or ""


def host_key(raw: Any) -> str | None:
    """The host key ddctl pinned in the metadata, if it is one."""
    return deploy.pinnable(items(raw).get(HOST_KEY_ITEM))


def zone_of(raw: Any) -> str:
    """The zone's name out of the instance's zone URL."""
    return str(raw.zone).rstrip("/").rsplit("/", 1)[-1]


def region_of(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1``."""
    return zone.rsplit("-", 1)[0]
