"""Compute Engine's errors as ``ProvisionError``: the codes decide what failover does next (pure).

GCE refuses in two shapes. An asynchronous refusal comes back in the finished
Operation (``error.errors[].code``): a zone out of capacity, a quota with the
region in its ``quota_info.dimensions``, the project-wide GPU quota. A
synchronous one is raised by the client (``google.api_core.exceptions``) with
Google's ``errors[].reason``: a 403 whose reason is ``quotaExceeded`` is a
quota, other 403s and 401 are the credentials, rate limits and 5xx are tried
again, and a request GCE calls malformed is the file's fault.
"""

from __future__ import annotations

from typing import Any

from ddctl.errors import ProvisionError, ProvisionKind, ProvisionScope
from ddctl.providers.gcp.clients import OperationFailed

CAPACITY = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "UNSUPPORTED_OPERATION"})
QUOTA = frozenset({"QUOTA_EXCEEDED", "quotaExceeded", "QUOTA_LIMIT"})
CLOUD_QUOTA_METRICS = ("gpus_all_regions", "GPUS-ALL-REGIONS", "GPUS_ALL_REGIONS")
"""A quota of the whole project: no other region helps."""
TRANSIENT = frozenset(
    {"RESOURCE_OPERATION_RATE_EXCEEDED", "rateLimitExceeded", "userRateLimitExceeded", "backendError", "internalError",
     "INTERNAL_ERROR", "SERVICE_UNAVAILABLE", "RESOURCE_NOT_READY", "TIMEOUT"}
)  # fmt: skip
CREDENTIAL_REASONS = frozenset(
    {
        "forbidden",
        "insufficientPermissions",
        "accessNotConfigured",
        "authError",
        "required",
        "SERVICE_DISABLED",
        "IAM_PERMISSION_DENIED",
    }
)
LOCAL_CREDENTIAL_ERRORS = frozenset({"DefaultCredentialsError", "RefreshError", "TransportError"})
NETWORK_ERRORS = frozenset({"ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout", "RetryError", "DeadlineExceeded"})


def kind_of(code: str, status: int, message: str = "") -> tuple[ProvisionKind, ProvisionScope]:
    """What a GCE error code (an Operation's, or a reason) and HTTP status mean for failover."""
    if code in CAPACITY:
        return "capacity", "zone"
    if code == "GPUS_ALL_REGIONS":
        return "quota", "cloud"
    if code in QUOTA:
        return "quota", "region"
    if code in TRANSIENT or "RESOURCE_OPERATION_RATE_EXCEEDED" in message or status == 429 or status >= 500:
        return "transient", "region"
    if code in CREDENTIAL_REASONS or status in (401, 403):
        return "credentials", "cloud"
    return "config", "cloud"


def _cloudwide(code: str, text: str) -> str:
    """``GPUS_ALL_REGIONS`` for a quota of the whole project (no other region helps), else ``code``."""
    return "GPUS_ALL_REGIONS" if code in QUOTA and any(m in text for m in CLOUD_QUOTA_METRICS) else code


def _operation_error(operation: Any) -> tuple[str, int, dict[str, str], str]:
    """(code, HTTP status, the quota's dimensions, message) of a failed Operation's first error."""
    first = operation.error.errors[0]
    dimensions: dict[str, str] = {}
    metric = ""
    for detail in first.error_details:
        info = detail.quota_info
        if info.metric_name or info.limit_name:
            dimensions, metric = {str(k): str(v) for k, v in info.dimensions.items()}, f"{info.metric_name} {info.limit_name}"
    code, message = str(first.code), str(first.message)
    return _cloudwide(code, f"{metric} {message}"), int(operation.http_error_status_code or 0), dimensions, message


def http_status(error: Exception) -> int:
    """The HTTP status of a ``google.api_core`` exception (its ``code``), 0 for anything else."""
    code = getattr(error, "code", 0)
    return code if isinstance(code, int) else 0


def _raised_error(error: Exception) -> tuple[str, int, str]:
    """(reason, HTTP status, message) of a ``google.api_core`` exception (its first ``errors[].reason``)."""
    status = http_status(error)
    details = getattr(error, "errors", None) or []
    reasons = [str(d.get("reason", "")) for d in details if isinstance(d, dict)]
    message = str(getattr(error, "message", "") or error)
    reason = next((r for r in reasons if r), "") or type(error).__name__
    if "RESOURCE_OPERATION_RATE_EXCEEDED" in message:
        reason = "RESOURCE_OPERATION_RATE_EXCEEDED"
    return _cloudwide(reason, message), status, message


def classify(error: Exception, *, region: str = "", zone: str = "", credentials: str = "", doing: str = "") -> ProvisionError:
    """``error`` (a failed Operation, an API exception, a credential or network failure) as a ProvisionError.

    ``doing`` says what was asked (e.g. "listing the instances of run r1 in project p"): a refused read names it."""
    if isinstance(error, ProvisionError):
        return error
    name = type(error).__name__
    kind: ProvisionKind
    scope: ProvisionScope
    if isinstance(error, OperationFailed):
        code, status, dimensions, message = _operation_error(error.operation)
        kind, scope = kind_of(code, status, message)
        region = dimensions.get("region", region) if scope == "region" else region
    elif hasattr(error, "errors") and hasattr(error, "code"):  # google.api_core.exceptions.GoogleAPICallError
        code, status, message = _raised_error(error)
        kind, scope = kind_of(code, status, message)
    elif name in LOCAL_CREDENTIAL_ERRORS:
        code, message, (kind, scope) = name, str(error), ("credentials", "cloud")
    elif name in NETWORK_ERRORS or isinstance(error, (OSError, TimeoutError)):
        code, message, (kind, scope) = name, str(error), ("transient", "region")
    else:
        code, message, (kind, scope) = name, str(error), ("transient", "region")
    where = f" in {zone or region}" if (zone or region) else ""
    where += f": {doing}" if doing else ""
    if kind == "credentials" and credentials:
        message = f"{message} (credentials: {credentials})"
    return ProvisionError(
        f"gcp{where}: {code}: {message}", kind=kind, scope=scope, code=code, provider="gcp", region=region, zone=zone
    )
