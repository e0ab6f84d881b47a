"""The Compute Engine fake's REST surface (which path and verb is which method) and the records it keeps: the calls it
answered, its fault rules, its operations, a request as a handler sees it, and what the metadata server says of an
instance. Kept apart from ``gcp_cloud.py`` so the server reads as what it does."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gcp_shapes import ApiError

DEFAULT_ZONES = {"us-central1": ["us-central1-a", "us-central1-b", "us-central1-c"],
                 "europe-west4": ["europe-west4-a", "europe-west4-b"], "us-east1": ["us-east1-b", "us-east1-c"],
                 "asia-east1": ["asia-east1-a", "asia-east1-b"]}  # fmt: skip
STATUSES = {"PROVISIONING", "STAGING", "RUNNING", "STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "REPAIRING", "TERMINATED"}
ROUTES = [(verb, re.compile("/compute/v1/projects/(?P<project>[^/]+)/" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", path) + "$"),
            key) for verb, path, key in [
    ("POST", "zones/{zone}/instances", "instances.insert"), ("GET", "zones/{zone}/instances", "instances.list"),
    ("GET", "aggregated/instances", "instances.aggregatedList"), ("GET", "zones/{zone}/instances/{name}", "instances.get"),
    ("DELETE", "zones/{zone}/instances/{name}", "instances.delete"),
    ("POST", "zones/{zone}/instances/{name}/simulateMaintenanceEvent", "instances.simulateMaintenanceEvent"),
    ("POST", "zones/{zone}/instances/{name}/setLabels", "instances.setLabels"),
    ("POST", "zones/{zone}/instances/{name}/setMetadata", "instances.setMetadata"),
    ("GET", "zones/{zone}/operations", "zoneOperations.list"), ("GET", "zones/{zone}/operations/{name}", "zoneOperations.get"),
    ("POST", "zones/{zone}/operations/{name}/wait", "zoneOperations.wait"),
    ("DELETE", "zones/{zone}/operations/{name}", "zoneOperations.delete"),
    ("GET", "global/operations", "globalOperations.list"), ("GET", "global/operations/{name}", "globalOperations.get"),
    ("POST", "global/operations/{name}/wait", "globalOperations.wait"),
    ("DELETE", "global/operations/{name}", "globalOperations.delete"),
    ("POST", "global/firewalls", "firewalls.insert"), ("GET", "global/firewalls", "firewalls.list"),
    ("GET", "global/firewalls/{name}", "firewalls.get"), ("PATCH", "global/firewalls/{name}", "firewalls.patch"),
    ("DELETE", "global/firewalls/{name}", "firewalls.delete"),
    ("GET", "zones", "zones.list"), ("GET", "zones/{zone}", "zones.get"), ("GET", "global/networks/{name}", "networks.get"),
    ("GET", "zones/{zone}/instances/{name}/serialPort", "instances.getSerialPortOutput"),
    ("POST", "regions/{region}/addresses", "addresses.insert"), ("GET", "regions/{region}/addresses", "addresses.list"),
    ("GET", "regions/{region}/addresses/{name}", "addresses.get"),
    ("DELETE", "regions/{region}/addresses/{name}", "addresses.delete"),
    ("GET", "regions/{region}/operations/{name}", "regionOperations.get"),
    ("POST", "regions/{region}/operations/{name}/wait", "regionOperations.wait"),
]]  # fmt: skip
METHODS = {key for _, _, key in ROUTES}
#: Methods that answer with an Operation, i.e. what fail_operation() can fail.
OPERATION_METHODS = {m for m in METHODS if "Operations" not in m and m.split(".")[1] in (
    "insert", "delete", "patch", "setLabels", "setMetadata", "simulateMaintenanceEvent")}  # fmt: skip


@dataclass(frozen=True)
class Call:
    """One request as the fake saw it; `status` is the HTTP status it answered."""

    method: str
    zone: str | None
    path: str
    query: dict[str, str]
    body: dict[str, Any] | None
    status: int


@dataclass
class Rule:
    method: str
    zone: str | None
    times: int | None
    error: ApiError | None = None  # fail(): answer this
    op_error: dict[str, Any] | None = None  # fail_operation(): errors[0] template, with http_status
    http_status: int = 503


@dataclass
class Op:
    body: dict[str, Any]
    done_at: float
    on_done: Callable[[], None] | None
    error: dict[str, Any] | None


@dataclass
class Req:
    project: str
    zone: str | None
    name: str
    query: dict[str, str]
    body: dict[str, Any]
    fault: dict[str, Any] | None


@dataclass
class Life:
    """What the metadata server would say about an instance, and the timers of a played preemption."""

    preempted: bool = False
    stop_at: float | None = None
    gone_at: float | None = None
    delete: bool = False
    maintenance: str = "NONE"
    maintenance_until: float | None = None


def scope(p: dict[str, str]) -> str | None:
    """Where a call acts: its zone, ``regions/R`` for a regional resource, None for a global one."""
    return p.get("zone") or (f"regions/{p['region']}" if "region" in p else None)


def hosts(network: Any, skip: int) -> Iterator[str]:
    return (str(a) for i, a in enumerate(network.hosts()) if i >= skip)
