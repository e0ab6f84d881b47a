"""botocore's errors as ``ProvisionError``: the EC2 error code decides what failover does next (pure).

EC2 names its refusals with stable codes; the message is for people. The
mapping follows what each code means for where to try next: a zone without
capacity is left for another zone, an account limit for another region, bad
credentials stop the cloud, throttling and 5xx are tried again, and a request
EC2 calls malformed is the file's fault (abort with EC2's own words).
"""

from __future__ import annotations

from ddctl.errors import ProvisionError, ProvisionKind, ProvisionScope

CAPACITY = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "SpotMaxPriceTooLow",
        "Unsupported",
        "InsufficientFreeAddressesInSubnet",
    }
)
QUOTA = frozenset(
    {
        "MaxSpotInstanceCountExceeded",
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "AddressLimitExceeded",
        "SecurityGroupLimitExceeded",
        "RulesPerSecurityGroupLimitExceeded",
        "KeyPairLimitExceeded",
    }
)
CREDENTIALS = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "OptInRequired",
        "UnrecognizedClientException",
    }
)
TRANSIENT = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "IncorrectInstanceState",
    }
)
LOCAL_CREDENTIAL_ERRORS = frozenset(
    {
        "NoCredentialsError",
        "PartialCredentialsError",
        "ProfileNotFound",
        "NoRegionError",
        "TokenRetrievalError",
        "SSOTokenLoadError",
    }
)
NETWORK_ERRORS = frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError"})


def kind_of(code: str, status: int) -> tuple[ProvisionKind, ProvisionScope]:
    """What an EC2 error code (and HTTP status) means for failover."""
    if code in CAPACITY:
        return "capacity", "zone"
    if code in QUOTA:
        return "quota", "region"
    if code in CREDENTIALS or status in (401, 403):
        return "credentials", "cloud"
    if code in TRANSIENT or status >= 500 or status == 429:
        return "transient", "region"
    return "config", "cloud"


def classify(error: Exception, *, region: str = "", zone: str = "", credentials: str = "") -> ProvisionError:
    """``error`` (a botocore ClientError, a credential or network failure, anything) as a ProvisionError.

    ``credentials`` says which profile was used, so a refusal names it."""
    if isinstance(error, ProvisionError):
        return error
    name = type(error).__name__
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # a ClientError: EC2 answered
        err = response.get("Error") or {}
        code = str(err.get("Code") or name)
        status = int((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
        message = str(err.get("Message") or error)
    else:
        code, status, message = name, 0, str(error)
    kind: ProvisionKind
    scope: ProvisionScope
    if name in LOCAL_CREDENTIAL_ERRORS:
        kind, scope = "credentials", "cloud"
    elif name in NETWORK_ERRORS:
        kind, scope = "transient", "region"
    elif isinstance(response, dict):
        kind, scope = kind_of(code, status)
    else:
        kind, scope = "transient", "region"
    where = f" in {zone or region}" if (zone or region) else ""
    if kind == "credentials" and credentials:
        message = f"{message} (credentials: {credentials})"
    return ProvisionError(
        f"aws{where}: {code}: {message}", kind=kind, scope=scope, code=code, provider="aws", region=region, zone=zone
    )
