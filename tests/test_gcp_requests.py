"""The gcp provider's pure parts: what GCE is sent (insert body, labels, names, metadata) and how its refusals read.

Refusals are fed in both of GCE's shapes: a finished Operation carrying ``error.errors[]`` (the recorded
payloads of ``gcp_shapes``) and an exception raised by the client with Google's ``errors[].reason``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import google.api_core.exceptions as gexc
import pytest
from google.auth.exceptions import DefaultCredentialsError
from google.cloud import compute_v1

import gcp_shapes
from ddctl.errors import ProvisionError
from ddctl.providers.base import InstanceSpec
from ddctl.providers.gcp.clients import OperationFailed
from ddctl.providers.gcp.errors import classify
from ddctl.providers.gcp.machines import (
    Machine,
    host_key,
    insert_body,
    instance_name,
    label,
    labels,
    metadata_items,
    private_address,
    public_address,
    resource_name,
)
from ddctl.providers.gcp.orphans import expired, orphaned

SPEC = InstanceSpec(run="Big_Run", name="L3", region="Iowa", role="learner", argv=("python",), log=Path("/tmp/l"))
MACHINE = Machine(project="p", image="", python="/opt/ddctl/venv/bin/python", spot=True, network="default", disk_gb=80)
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ8vYJcL3D7RnVq4c8X6b1nq9y0uOqkR7nBqZ2xY6bCd"


def failed(shape: dict[str, Any], status: int = 503, **values: str) -> OperationFailed:
    """A finished Operation with ``shape`` as its one error, as the client would parse it off the wire."""
    entry = gcp_shapes.fill(shape, {"project": "p", "zone": "us-central1-a", "region": "us-central1",
                                    "zones_available": "us-central1-b", **values})  # fmt: skip
    raw = {"name": "operation-1", "status": "DONE", "httpErrorStatusCode": status, "error": {"errors": [entry]}}
    return OperationFailed(compute_v1.Operation.from_json(json.dumps(raw), ignore_unknown_fields=True))


@pytest.mark.parametrize(
    ("shape", "status", "kind", "scope", "code"),
    [
        (gcp_shapes.ZONE_EXHAUSTED, 503, "capacity", "zone", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"),
        (gcp_shapes.ZONE_EXHAUSTED_PLAIN, 503, "capacity", "zone", "ZONE_RESOURCE_POOL_EXHAUSTED"),
        (gcp_shapes.UNSUPPORTED_OPERATION, 400, "capacity", "zone", "UNSUPPORTED_OPERATION"),
        (gcp_shapes.QUOTA_EXCEEDED_REGION, 403, "quota", "region", "QUOTA_EXCEEDED"),
        (gcp_shapes.PREEMPTIBLE_QUOTA_EXCEEDED_REGION, 403, "quota", "region", "QUOTA_EXCEEDED"),
        (gcp_shapes.GPUS_ALL_REGIONS, 403, "quota", "cloud", "GPUS_ALL_REGIONS"),
        ({"code": "RESOURCE_OPERATION_RATE_EXCEEDED", "message": "slow down", "errorDetails": []}, 403, "transient", "region",
         "RESOURCE_OPERATION_RATE_EXCEEDED"),
        ({"code": "INTERNAL_ERROR", "message": "oops", "errorDetails": []}, 500, "transient", "region", "INTERNAL_ERROR"),
        ({"code": "RESOURCE_NOT_FOUND", "message": "no image", "errorDetails": []}, 404, "config", "cloud", "RESOURCE_NOT_FOUND"),
    ],
)  # fmt: skip
def test_each_operation_error_means_what_failover_needs(
    shape: dict[str, Any], status: int, kind: str, scope: str, code: str
) -> None:
    error = classify(failed(shape, status), region="us-central1", zone="us-central1-a")
    assert (error.kind, error.scope, error.code, error.provider) == (kind, scope, code, "gcp")
    assert "us-central1-a" in str(error)


def test_a_regional_quota_names_the_region_its_dimensions_give() -> None:
    error = classify(failed(gcp_shapes.QUOTA_EXCEEDED_REGION, 403, region="europe-west4"), region="us-central1", zone="")
    assert (error.kind, error.scope, error.region, error.where) == ("quota", "region", "europe-west4", "europe-west4")
    assert "NVIDIA_L4_GPUS" in str(error)


@pytest.mark.parametrize(
    ("status", "reason", "message", "kind", "scope"),
    [
        (403, "quotaExceeded", "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 1.0 in region us-central1.", "quota", "region"),
        (403, "quotaExceeded", "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.", "quota", "cloud"),
        (403, "forbidden", "Required 'compute.instances.create' permission for 'projects/p'", "credentials", "cloud"),
        (403, "insufficientPermissions", "Request had insufficient authentication scopes.", "credentials", "cloud"),
        (403, "accessNotConfigured", "Compute Engine API has not been used in project p", "credentials", "cloud"),
        (401, "authError", "Request had invalid authentication credentials.", "credentials", "cloud"),
        (403, "rateLimitExceeded", "Operation rate exceeded for resource 'p'. RESOURCE_OPERATION_RATE_EXCEEDED", "transient",
         "region"),
        (429, "rateLimitExceeded", "Rate Limit Exceeded", "transient", "region"),
        (503, "backendError", "Internal error. Please try again.", "transient", "region"),
        (400, "invalid", "Invalid value for field 'resource.machineType': 'g9-huge'.", "config", "cloud"),
        (409, "alreadyExists", "The resource 'projects/p/zones/z/instances/x' already exists", "config", "cloud"),
    ],
)  # fmt: skip
def test_each_raised_error_means_what_failover_needs(status: int, reason: str, message: str, kind: str, scope: str) -> None:
    raised = gexc.from_http_status(status, message, errors=[{"reason": reason, "message": message, "domain": "global"}])
    error = classify(raised, region="us-central1", zone="us-central1-a", credentials="ADC")
    assert (error.kind, error.scope, error.provider) == (kind, scope, "gcp")
    assert message in str(error)
    assert ("(credentials: ADC)" in str(error)) == (kind == "credentials")


def test_local_credential_trouble_and_the_network_are_told_apart() -> None:
    assert classify(DefaultCredentialsError("no ADC")).kind == "credentials"
    assert classify(ConnectionRefusedError("refused")).kind == "transient"
    assert classify(TimeoutError("operation not done")).kind == "transient"
    same = ProvisionError("x", kind="quota", scope="region")
    assert classify(same) is same


# -- what GCE is sent ----------------------------------------------------------------------------
def test_a_learner_is_spot_deleted_when_preempted_and_never_migrated() -> None:
    body = insert_body(SPEC, MACHINE, name="ddctl-x", zone="us-central1-a", machine_type="g2-standard-4",
                       metadata={"k": "v"}, expires_at=1_800_000_000)  # fmt: skip
    assert body["scheduling"] == {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                                  "onHostMaintenance": "TERMINATE", "automaticRestart": False}  # fmt: skip
    assert body["machineType"] == "zones/us-central1-a/machineTypes/g2-standard-4"
    assert body["disks"][0]["initializeParams"]["diskSizeGb"] == "80"  # int64 travels as a string
    assert body["networkInterfaces"][0]["accessConfigs"] == [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
    assert "guestAccelerators" not in body  # a g2 comes with its L4
    assert body["tags"]["items"] == ["ddctl-big-run"]
    compute_v1.Instance.from_json(json.dumps(body))  # the client's own type takes it as is


def test_the_syncer_is_standard_at_its_reserved_address_and_an_n1_gets_its_gpus_attached() -> None:
    syncer = InstanceSpec(run="r", name="syncer", region="iowa", role="syncer", argv=(), log=Path("/tmp/s"))
    n1 = Machine(
        project="p", image="img", python="/p", spot=True, network="net", disk_gb=50, accelerator="nvidia-tesla-t4",
        accelerator_count=2,
    )  # fmt: skip
    body = insert_body(syncer, n1, name="s", zone="us-east1-b", machine_type="n1-standard-8", metadata={},
                       expires_at=0, address="100.100.192.7")  # fmt: skip
    assert body["scheduling"]["provisioningModel"] == "STANDARD" and body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert body["networkInterfaces"][0]["accessConfigs"][0]["natIP"] == "100.100.192.7"
    assert body["networkInterfaces"][0]["network"] == "global/networks/net"
    assert body["guestAccelerators"] == [{"acceleratorType": "zones/us-east1-b/acceleratorTypes/nvidia-tesla-t4",
                                          "acceleratorCount": 2}]  # fmt: skip
    assert body["tags"]["items"] == ["ddctl-r", "ddctl-r-syncer"]


def test_labels_follow_gces_rules_and_the_exact_names_travel_in_the_metadata() -> None:
    found = labels(SPEC, 1_800_000_000.7)
    assert found == {"ddctl-run": "big_run", "ddctl-name": "l3", "ddctl-role": "learner", "ddctl-region": "iowa",
                     "ddctl-expires-at": "1800000000"}  # fmt: skip
    assert all(re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) and re.fullmatch(r"[a-z0-9_-]{0,63}", v) for k, v in found.items())
    assert label("A" * 100 + "!") == "a" * 63
    meta = metadata_items(SPEC, HOST_KEY, "ssh-ed25519 CLIENT", "#!/bin/sh\n")
    assert meta["ddctl-run"] == "Big_Run" and meta["ddctl-name"] == "L3" and meta["ddctl-host-key"] == HOST_KEY
    assert meta["ssh-keys"] == "root:ssh-ed25519 CLIENT" and meta["startup-script"] == "#!/bin/sh\n"


def test_instance_names_are_valid_unique_and_bounded() -> None:
    long = InstanceSpec(run="r" * 40, name="L_" + "x" * 38, region="e", role="learner", argv=(), log=Path("/tmp/l"))
    names = {instance_name(long) for _ in range(20)}
    assert len(names) == 20
    assert all(re.fullmatch(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?", n) for n in names)
    assert resource_name("Big_Run", "ssh") == "ddctl-big-run-ssh"


# -- what comes back ------------------------------------------------------------------------------
def _instance(
    nat: str = "100.100.192.9", key: str = HOST_KEY, run: str = "r", expires: str = "99", ip: str = "10.128.0.7"
) -> Any:
    raw = {"name": "i", "status": "RUNNING", "labels": {"ddctl-run": label(run), "ddctl-expires-at": expires},
           "metadata": {"items": [{"key": "ddctl-host-key", "value": key}, {"key": "ddctl-run", "value": run}]},
           "networkInterfaces": [{"networkIP": ip, "accessConfigs": [{"natIP": nat}]}]}  # fmt: skip
    return compute_v1.Instance.from_json(json.dumps(raw))


def test_only_a_real_address_and_a_real_host_key_are_used() -> None:
    assert public_address(_instance()) == "100.100.192.9" and host_key(_instance()) == HOST_KEY
    assert public_address(_instance(nat="100.100.192.9; rm -rf /")) is None
    assert public_address(_instance(nat="")) is None
    assert host_key(_instance(key="ssh-rsa AAAA")) is None
    assert host_key(_instance(key=HOST_KEY + "\nevil")) is None


def test_a_private_address_gce_describes_is_used_only_if_it_is_an_ipv4_address() -> None:
    assert private_address(_instance()) == "10.128.0.7"
    hostile = ("", "10.128.0.7/20", "10.128.0.300", "fd00::1", "10.128.0.7 ", "10.128.0.7; rm -rf /", "a" * 10_000)
    assert [private_address(_instance(ip=value)) for value in hostile] == [""] * len(hostile)
    assert private_address(compute_v1.Instance(name="i")) == ""  # no interface at all
    odd = SimpleNamespace(network_interfaces=[SimpleNamespace(network_i_p=167772167)])  # not a string: not used
    assert private_address(odd) == ""


def test_orphans_are_instances_of_dead_runs_or_past_their_time() -> None:
    live, dead, old, garbled = (
        _instance(run="live"),
        _instance(run="dead"),
        _instance(run="live", expires="5"),
        _instance(run="live", expires="soon"),
    )
    assert orphaned([live, dead, old, garbled], {"live"}, now=10.0) == [dead, old]
    assert not expired({"ddctl-expires-at": "soon"}, 10.0) and expired({"ddctl-expires-at": "5"}, 10.0)
