"""The Compute Engine fake's tests share one fake per module, wiped before each test, its REST clients, and an
Instance built as a provider would send it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.cloud import compute_v1

from gcp_cloud import GcpCloud

ZONE = "us-central1-a"
DONE = compute_v1.Operation.Status.DONE


@pytest.fixture(scope="module")
def cloud() -> Iterator[GcpCloud]:
    with GcpCloud() as c:
        yield c


@pytest.fixture(autouse=True)
def _fresh(cloud: GcpCloud) -> None:
    cloud.reset()


@pytest.fixture(scope="module")
def clients(cloud: GcpCloud) -> dict[str, Any]:
    names = [
        "InstancesClient",
        "ZoneOperationsClient",
        "GlobalOperationsClient",
        "FirewallsClient",
        "ZonesClient",
        "NetworksClient",
    ]
    return {n.removesuffix("Client"): cloud.client(n) for n in names}


def vm(name: str, zone: str = ZONE, *, machine: str = "n2-standard-4", spot: bool = False, action: str | None = None,
       labels: dict[str, str] | None = None, nat: bool = True) -> compute_v1.Instance:  # fmt: skip
    """An Instance as a provider would send it; GPU machine types get onHostMaintenance=TERMINATE as Google requires."""
    scheduling = compute_v1.Scheduling(provisioning_model="SPOT" if spot else "STANDARD")
    if action:
        scheduling.instance_termination_action = action
    if machine.startswith("g2-"):
        scheduling.on_host_maintenance = "TERMINATE"
    access = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")] if nat else []
    return compute_v1.Instance(
        name=name, machine_type=f"zones/{zone}/machineTypes/{machine}", labels=labels or {}, scheduling=scheduling,
        disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
            disk_size_gb=50, source_image="projects/debian-cloud/global/images/family/debian-12"))],
        network_interfaces=[compute_v1.NetworkInterface(network="global/networks/default", access_configs=access)],
    )  # fmt: skip


def live(cloud: GcpCloud, name: str, zone: str = ZONE) -> dict[str, Any]:
    """The stored instance, which must exist."""
    found = cloud.instance(zone, name)
    assert found is not None, f"no instance {zone}/{name}"
    return found


def create(clients: dict[str, Any], cloud: GcpCloud, inst: compute_v1.Instance, zone: str = ZONE) -> compute_v1.Operation:
    """insert_unary + wait, the way a provider should (the non-unary insert() polls compute.googleapis.com by default)."""
    op = clients["Instances"].insert_unary(project=cloud.project, zone=zone, instance_resource=inst, timeout=10)
    done: compute_v1.Operation = clients["ZoneOperations"].wait(project=cloud.project, zone=zone, operation=op.name, timeout=10)
    return done
