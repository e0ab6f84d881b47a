"""Per-job secret, per-identity tokens derived from it, and the two refusals.

A token is ``<identity>.<hex HMAC-SHA256(secret, identity)>``: the syncer needs
only the job secret to check any learner's token, a learner's token cannot be
turned into another learner's, and ``admin`` (the laptop, the dashboard) is
just another identity.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from ddctl_agents.errors import ConfigError, Forbidden, Unauthorized

ADMIN = "admin"
IDENTITY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: "$" lets a trailing newline through
__all__ = ["ADMIN", "Forbidden", "Unauthorized", "check_identity", "derive_token", "read_secret", "relay_key", "verify_token"]


def check_identity(identity: str) -> str:
    if not IDENTITY.match(identity):
        raise ConfigError(f"identity {identity!r} must be 1-64 characters of letters, digits, '_', '.', '-'")
    return identity


def derive_token(secret: bytes, identity: str) -> str:
    check_identity(identity)
    mac = hmac.new(secret, b"ddctl-token:" + identity.encode(), hashlib.sha256).hexdigest()
    return f"{identity}.{mac}"


def relay_key(secret: bytes, region: str) -> bytes:
    """The key region ``region``'s relay checks its learners' tokens with (``derive_token(relay_key(...), learner)``).

    Derived one way from the job secret, so a relay (it runs on a learner's machine) can tell its region's learners
    from anyone else, but can neither mint a token the synchronizer takes nor admit another region's learners."""
    check_identity(region)
    return hmac.new(secret, b"ddctl-relay:" + region.encode(), hashlib.sha256).digest()


def verify_token(secret: bytes, header: str | None) -> str:
    """The identity an ``Authorization: Bearer <token>`` header proves, or Unauthorized."""
    if not header:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("Authorization must be 'Bearer <token>'")
    identity, _, _ = token.strip().rpartition(".")
    if not IDENTITY.match(identity) or not hmac.compare_digest(token.strip(), derive_token(secret, identity)):
        raise Unauthorized("token not valid for this job")
    return identity


def read_secret(text: str) -> bytes:
    """The job secret as stored in its file: hex, at least 32 bytes."""
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        raise ConfigError("job secret must be hex") from None
    if len(secret) < 32:
        raise ConfigError(f"job secret must be at least 32 bytes, got {len(secret)}")
    return secret
