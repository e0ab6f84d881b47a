"""Wire shapes for the Compute Engine fake (gcp_cloud): error bodies, recorded operation errors, filters, paging.

Kept apart from gcp_cloud.py so the server stays readable and other tests can import the payload constants alone.

The operation-error constants below are the `error.errors[]` entries of a failed Operation, exactly as they travel
(camelCase). `{project}`, `{zone}`, `{region}` and `{zones_available}` in their strings are filled in by the fake with
the failing call's values, so one constant serves every zone. Sources:

- ZONE_EXHAUSTED: a gcloud rendering of a real ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS answer recorded in CockroachDB's
  roachprod GCE tests (TestParseGCECapacityError): errorDetails = localizedMessage + errorInfo{domain
  "compute.googleapis.com", reason "resource_availability", metadatas{vmType, zone, zonesAvailable}}. Machine type swapped.
- GPUS_ALL_REGIONS: gcloud's rendering of a real answer ("metric name = compute.googleapis.com/gpus_all_regions, limit name
  = GPUS-ALL-REGIONS-per-project, limit = 0.0, dimensions = global: global"), i.e. quotaInfo.dimensions is
  {"global": "global"}, not a region.
- QUOTA_EXCEEDED_REGION / PREEMPTIBLE_QUOTA_EXCEEDED_REGION: same QuotaExceededInfo shape (compute v1 schema: metricName,
  limitName, dimensions, limit) with the per-region limit names Google's quota ids use (NVIDIA-L4-GPUS-per-project-region).
- UNSUPPORTED_OPERATION: the code is real; the wording is illustrative (no recording found).
"""

from __future__ import annotations

import base64
import copy
import fnmatch
import hashlib
import ipaddress
import json
import re
import secrets
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

BASE = "https://www.googleapis.com/compute/v1"
#: natIPs come from here (inside the AWS fake's 100.100.0.0/16, but its pool is handed out from the bottom up).
NAT_POOL = ipaddress.IPv4Network("100.100.192.0/18")
INTERNAL_POOL = ipaddress.IPv4Network("10.128.0.0/16")  # the default network's us-central1 subnet; .1 is the gateway
NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
LABEL_KEY_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE_RE = re.compile(r"[a-z0-9_-]{0,63}")
GPU_FAMILIES = ("a2-", "a3-", "a4-", "g2-", "g4-")  # machine types with built-in GPUs (no guestAccelerators needed)

ZONE_EXHAUSTED: dict[str, Any] = {
    "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "message": "The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill the request."
    "  '(resource type:compute)'.",
    "errorDetails": [
        {"localizedMessage": {"locale": "en-US", "message": "A g2-standard-4 VM instance is currently unavailable in the {zone} "
         "zone. Consider trying your request in the {zones_available} zone(s), which currently has capacity to accommodate "
         "your request."}},
        {"errorInfo": {"domain": "compute.googleapis.com", "reason": "resource_availability",
                       "metadatas": {"vmType": "g2-standard-4", "zone": "{zone}", "zonesAvailable": "{zones_available}"}}},
    ],
}  # fmt: skip
ZONE_EXHAUSTED_PLAIN: dict[str, Any] = {
    "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
    "message": "The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill the request."
    "  Try a different zone, or try again later.",
    "errorDetails": [],
}
GPUS_ALL_REGIONS: dict[str, Any] = {
    "code": "QUOTA_EXCEEDED",
    "message": "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
    "errorDetails": [
        {"quotaInfo": {"metricName": "compute.googleapis.com/gpus_all_regions", "limitName": "GPUS-ALL-REGIONS-per-project",
                       "dimensions": {"global": "global"}, "limit": 0}},
    ],
}  # fmt: skip
QUOTA_EXCEEDED_REGION: dict[str, Any] = {
    "code": "QUOTA_EXCEEDED",
    "message": "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region {region}.",
    "errorDetails": [
        {"quotaInfo": {"metricName": "compute.googleapis.com/nvidia_l4_gpus", "limitName": "NVIDIA-L4-GPUS-per-project-region",
                       "dimensions": {"region": "{region}"}, "limit": 0}},
    ],
}  # fmt: skip
PREEMPTIBLE_QUOTA_EXCEEDED_REGION: dict[str, Any] = {
    "code": "QUOTA_EXCEEDED",
    "message": "Quota 'PREEMPTIBLE_NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region {region}.",
    "errorDetails": [
        {"quotaInfo": {"metricName": "compute.googleapis.com/preemptible_nvidia_l4_gpus",
                       "limitName": "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region", "dimensions": {"region": "{region}"},
                       "limit": 0}},
    ],
}  # fmt: skip
UNSUPPORTED_OPERATION: dict[str, Any] = {
    "code": "UNSUPPORTED_OPERATION",
    "message": "The accelerator type 'nvidia-l4' is not supported for machine type 'n1-standard-4' in zone '{zone}'.",
    "errorDetails": [],
}
#: The httpErrorStatusCode Google puts on a failed Operation, by error code (anything else: 503).
OPERATION_HTTP_STATUS = {"QUOTA_EXCEEDED": 403, "UNSUPPORTED_OPERATION": 400, "RESOURCE_NOT_FOUND": 404}
#: google.rpc canonical status names, as the JSON error body's "status".
STATUS_TEXT = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ALREADY_EXISTS",
    412: "FAILED_PRECONDITION", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}  # fmt: skip
_USAGE_LIMITS = {"quotaExceeded", "rateLimitExceeded", "userRateLimitExceeded", "dailyLimitExceeded"}
_DEFAULT_MESSAGES = {
    "quotaExceeded": "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
    "rateLimitExceeded": "Rate Limit Exceeded",
    "forbidden": "Required 'compute.instances.create' permission for 'projects/{project}/zones/{zone}/instances'",
    "backendError": "Internal error. Please try again or contact Google Support.",
}


class ApiError(Exception):
    """An HTTP error the fake answers with Google's JSON error body."""

    def __init__(self, status: int, message: str, reason: str, *, status_text: str | None = None,
                 error_info: dict[str, Any] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.body = error_body(status, message, reason, status_text=status_text, error_info=error_info)


def error_body(status: int, message: str, reason: str, *, status_text: str | None = None,
               error_info: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """`{"error": {code, message, errors[{message, domain, reason}], status}}`; error_info adds a google.rpc.ErrorInfo."""
    domain = "usageLimits" if reason in _USAGE_LIMITS else "global"
    errors = [{"message": message, "domain": domain, "reason": reason}]
    error: dict[str, Any] = {
        "code": status,
        "message": message,
        "errors": errors,
        "status": status_text or STATUS_TEXT.get(status, "UNKNOWN"),
    }
    if error_info is not None:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", **error_info}]
    return {"error": error}


def default_message(reason: str, status: int) -> str:
    return _DEFAULT_MESSAGES.get(reason, f"Error {status}: {reason}")


def not_found(path: str) -> ApiError:
    return ApiError(404, f"The resource '{path}' was not found", "notFound")


def invalid(field: str, value: Any, why: str) -> ApiError:
    """Google's wording for a bad field: "Invalid value for field 'resource.X': 'V'. Why"."""
    return ApiError(400, f"Invalid value for field '{field}': '{value}'. {why}", "invalid")


def fill(template: Any, values: dict[str, str]) -> Any:
    """A deep copy of `template` with `{key}` placeholders in every string replaced."""
    if isinstance(template, str):
        for key, value in values.items():
            template = template.replace("{" + key + "}", value)
        return template
    if isinstance(template, dict):
        return {k: fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, values) for v in template]
    return copy.deepcopy(template)


def fingerprint(value: Any) -> str:
    """An opaque 8-byte base64 fingerprint; for nothing it is "42WmSpB8rSM=", as on every unlabelled Google resource."""
    if not value:
        return "42WmSpB8rSM="
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return base64.b64encode(hashlib.sha256(text.encode()).digest()[:8]).decode()


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def check_labels(labels: dict[str, Any]) -> None:
    for key, value in labels.items():
        if not LABEL_KEY_RE.fullmatch(key) or not isinstance(value, str) or not LABEL_VALUE_RE.fullmatch(value):
            raise invalid("resource.labels", f"{key}={value}", "Label keys and values must match [a-z][a-z0-9_-]*.")


_TERM = re.compile(
    r"""\s*\(?\s*(?P<field>[A-Za-z][\w.-]*?)\s*(?P<op>!=|=|:|\beq\b|\bne\b)\s*(?P<value>"[^"]*"|'[^']*'|[^\s()"']+)\s*\)?\s*"""
)


def compile_filter(expr: str | None) -> Callable[[dict[str, Any]], bool]:
    """The part of Compute's list filter grammar ddctl uses: terms joined by AND or a space, each `field OP value`.

    `=`/`!=` compare exactly (`*` is a wildcard), `eq`/`ne` are full-match regexes, `:` is substring and `:*` means
    "present". Fields are dotted paths (`labels.owner`, `labels.ddctl-run`: label keys may hold '-', as SkyPilot's
    `(labels.skypilot-cluster-name = NAME)` relies on, `scheduling.provisioningModel`). OR is refused with a 400
    rather than ignored, so a test never passes on a filter the fake silently misread.
    """
    expr = (expr or "").strip()
    if re.search(r"\bOR\b", expr):
        raise ApiError(400, f"The fake supports only AND in filters: '{expr}'.", "invalid")
    terms: list[tuple[str, str, str]] = []
    pos = 0
    while pos < len(expr):
        if m := re.match(r"\s*AND\s+", expr[pos:]):
            pos += m.end()
            continue
        m = _TERM.match(expr, pos)
        if not m or m.end() == pos:
            raise ApiError(400, f"Invalid list filter expression '{expr}'.", "invalid")
        value = m["value"][1:-1] if m["value"][:1] in "\"'" else m["value"]
        terms.append((m["field"], m["op"], value))
        pos = m.end()

    def matches(item: dict[str, Any]) -> bool:
        for field, op, value in terms:
            found: Any = item
            for part in field.split("."):
                found = found.get(part) if isinstance(found, dict) else None
            text = None if found is None else (str(found).lower() if isinstance(found, bool) else str(found))
            if op == ":":
                ok = text is not None and (value == "*" or value in text)
            elif op in ("eq", "ne"):
                ok = text is not None and re.fullmatch(value, text) is not None
                ok = ok if op == "eq" else not ok
            else:
                ok = text is not None and fnmatch.fnmatchcase(text, value)
                ok = ok if op == "=" else not ok
            if not ok:
                return False
        return True

    return matches


def page(items: list[Any], query: dict[str, str]) -> tuple[list[Any], str | None]:
    """One page by maxResults (default and cap 500) and an opaque pageToken; a token we did not make is a 400."""
    try:
        size = min(int(query.get("maxResults", 500)), 500)
        token = query.get("pageToken")
        start = int(base64.urlsafe_b64decode(token.encode()).decode().removeprefix("offset:")) if token else 0
    except ValueError as e:
        raise invalid("pageToken", query.get("pageToken"), "Invalid page token.") from e
    if size < 0:
        raise invalid("maxResults", size, "Must be greater than or equal to 0.")
    end = start + (size or 500)
    token_out = base64.urlsafe_b64encode(f"offset:{end}".encode()).decode() if end < len(items) else None
    return items[start:end], token_out


def new_id() -> str:
    """A 19-digit uint64 id, as a string: JSON int64s are strings on Google's wire."""
    return str(10**18 + secrets.randbelow(8 * 10**18))


def _last(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def new_instance(body: dict[str, Any], project: str, zone: str) -> dict[str, Any]:
    """Validate an Instance as instances.insert does and add what Google adds at once (id, URLs, scheduling defaults)."""
    inst = copy.deepcopy(body)
    for required in ("name", "machineType", "disks"):
        if not inst.get(required):
            raise ApiError(400, f"Required field 'resource.{required}' not specified", "required")
    name, mt = inst["name"], re.search(r"(?:zones/([^/]+)/)?machineTypes/([^/]+)$", inst["machineType"])
    if not NAME_RE.fullmatch(name):
        raise invalid("resource.name", name, f"Must be a match of regex '{NAME_RE.pattern}'")
    if not mt or mt[1] not in (None, zone):
        raise invalid("resource.machineType", inst["machineType"], "Must be the URL to a Compute resource of the correct type")
    check_labels(inst.get("labels") or {})
    sched = inst.setdefault("scheduling", {})
    spot = sched.get("provisioningModel") == "SPOT" or bool(sched.get("preemptible"))
    if spot and sched.get("automaticRestart") is True:
        raise invalid("resource.scheduling.automaticRestart", "true", "Preemptible instances cannot be automatically restarted.")
    sched.setdefault("onHostMaintenance", "TERMINATE" if spot else "MIGRATE")
    sched.update(automaticRestart=sched.get("automaticRestart", not spot), preemptible=spot,
                 provisioningModel=sched.get("provisioningModel", "STANDARD"))  # fmt: skip
    if (inst.get("guestAccelerators") or mt[2].startswith(GPU_FAMILIES)) and sched["onHostMaintenance"] == "MIGRATE":
        raise ApiError(400, "Instances with guest accelerators do not support live migration.", "badRequest")
    for nic in inst.get("networkInterfaces", []):
        if _last(nic.get("network", "default")) != "default":
            raise not_found(f"projects/{project}/global/networks/{_last(nic['network'])}")
    url = f"{BASE}/projects/{project}/zones/{zone}"
    inst.update(kind="compute#instance", id=new_id(), creationTimestamp=now_rfc3339(), selfLink=f"{url}/instances/{name}",
                zone=url, status="PROVISIONING", machineType=f"{url}/machineTypes/{mt[2]}", deletionProtection=False,
                labelFingerprint=fingerprint(inst.get("labels")), canIpForward=inst.get("canIpForward", False))  # fmt: skip
    return inst


def wire_instance(inst: dict[str, Any], region: str, nat: Iterator[str], internal: Iterator[str]) -> None:
    """What Google fills in once the VM is really made: fingerprints, disk sources, accelerator URLs, addresses."""
    url, name, project = inst["zone"], inst["name"], inst["zone"].split("/projects/")[1].split("/")[0]
    metadata = inst.setdefault("metadata", {})
    metadata.update(kind="compute#metadata", fingerprint=fingerprint(metadata.get("items")))
    inst["tags"] = {**inst.get("tags", {}), "fingerprint": fingerprint(inst.get("tags", {}).get("items"))}
    for acc in inst.get("guestAccelerators", []):
        acc["acceleratorType"] = f"{url}/acceleratorTypes/{_last(acc['acceleratorType'])}"
    for i, disk in enumerate(inst["disks"]):
        size = disk.pop("initializeParams", {}).get("diskSizeGb", "10")
        disk.update(kind="compute#attachedDisk", index=i, type=disk.get("type", "PERSISTENT"), mode="READ_WRITE",
                    deviceName=disk.get("deviceName", f"persistent-disk-{i}"), diskSizeGb=str(size), interface="SCSI",
                    source=f"{url}/disks/{name if i == 0 else f'{name}-{i}'}", boot=disk.get("boot", i == 0))  # fmt: skip
    for i, nic in enumerate(inst.get("networkInterfaces", [])):
        nic.update(kind="compute#networkInterface", name=f"nic{i}", networkIP=next(internal), stackType="IPV4_ONLY",
                   network=f"{BASE}/projects/{project}/global/networks/default", fingerprint=fingerprint(nic),
                   subnetwork=f"{BASE}/projects/{project}/regions/{region}/subnetworks/default")  # fmt: skip
        for ac in nic.get("accessConfigs", []):
            ac.update(kind="compute#accessConfig", type=ac.get("type", "ONE_TO_ONE_NAT"), name=ac.get("name", "External NAT"),
                      natIP=ac.get("natIP") or next(nat), networkTier=ac.get("networkTier", "PREMIUM"))  # fmt: skip


def check_firewall(fw: dict[str, Any], project: str) -> None:
    """The checks Google makes that a provider can get wrong: a source for INGRESS, one rule list, string ports."""
    if not NAME_RE.fullmatch(str(fw.get("name", ""))):
        raise invalid("resource.name", fw.get("name", ""), f"Must be a match of regex '{NAME_RE.pattern}'")
    if _last(fw["network"]) != "default":
        raise not_found(f"projects/{project}/global/networks/{_last(fw['network'])}")
    if fw["direction"] not in ("INGRESS", "EGRESS"):
        raise invalid("resource.direction", fw["direction"], "Must be INGRESS or EGRESS.")
    if fw["direction"] == "INGRESS" and not any(fw.get(k) for k in ("sourceRanges", "sourceTags", "sourceServiceAccounts")):
        raise invalid("resource.sourceRanges", "", "An INGRESS rule needs sourceRanges, sourceTags or sourceServiceAccounts.")
    if bool(fw.get("allowed")) == bool(fw.get("denied")):
        raise invalid("resource.allowed", fw.get("allowed", ""), "Exactly one of allowed or denied must be specified.")
    for rule in fw.get("allowed") or fw.get("denied") or []:
        if not rule.get("IPProtocol"):
            raise ApiError(400, "Required field 'resource.allowed[0].IPProtocol' not specified", "required")
        for port in rule.get("ports", []):
            if not isinstance(port, str) or not re.fullmatch(r"\d{1,5}(-\d{1,5})?", port):
                raise invalid("resource.allowed[0].ports[0]", port, 'Ports must be strings like "22" or "8000-8100".')
    for cidr in fw.get("sourceRanges", []):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as e:
            raise invalid("resource.sourceRanges[0]", cidr, "Must be a CIDR range.") from e
    if not 0 <= int(fw["priority"]) <= 65535:
        raise invalid("resource.priority", fw["priority"], "Must be between 0 and 65535.")


def new_firewall(body: dict[str, Any], project: str) -> dict[str, Any]:
    fw = {"direction": "INGRESS", "priority": 1000, "disabled": False, "logConfig": {"enable": False}, **copy.deepcopy(body)}
    fw["network"] = f"{BASE}/projects/{project}/global/networks/{_last(fw.get('network', 'default'))}"
    check_firewall(fw, project)
    fw.update(kind="compute#firewall", id=new_id(), creationTimestamp=now_rfc3339(),
              selfLink=f"{BASE}/projects/{project}/global/firewalls/{fw['name']}")  # fmt: skip
    return fw


def no_results(scope: str) -> dict[str, Any]:
    """What aggregatedList puts under a scope with nothing in it."""
    return {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope '{scope}' on this page.",
                        "data": [{"key": "scope", "value": scope}]}}  # fmt: skip


def zone_json(project: str, zone: str, region: str, index: int) -> dict[str, Any]:
    base = f"{BASE}/projects/{project}"
    return {"kind": "compute#zone", "id": str(2000 + index), "name": zone, "description": zone, "status": "UP",
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00", "region": f"{base}/regions/{region}",
            "selfLink": f"{base}/zones/{zone}", "supportsPzs": False}  # fmt: skip


def network_json(project: str, regions: list[str]) -> dict[str, Any]:
    base = f"{BASE}/projects/{project}"
    return {"kind": "compute#network", "id": "4000000000000000001", "name": "default", "autoCreateSubnetworks": True,
            "description": "Default network for the project", "creationTimestamp": "2024-01-01T00:00:00.000-08:00",
            "subnetworks": [f"{base}/regions/{r}/subnetworks/default" for r in regions],
            "routingConfig": {"routingMode": "REGIONAL"}, "selfLink": f"{base}/global/networks/default"}  # fmt: skip
