"""Tokens: derived from the job secret, bound to one identity, unforgeable without it."""

from __future__ import annotations

import pytest

from ddctl_agents.errors import ConfigError
from ddctl_agents.service.auth import Unauthorized, check_identity, derive_token, read_secret, verify_token

SECRET = bytes(range(32))


def test_a_token_proves_its_identity() -> None:
    assert verify_token(SECRET, f"Bearer {derive_token(SECRET, 'L3')}") == "L3"
    assert verify_token(SECRET, f"bearer {derive_token(SECRET, 'admin')}") == "admin"


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Basic abc",
        "Bearer ",
        "Bearer L0",
        "Bearer L0." + "0" * 64,
        f"Bearer {derive_token(bytes(32), 'L0')}",  # signed by another job's secret
        f"Bearer L1.{derive_token(SECRET, 'L0').split('.')[1]}",  # L0's MAC under L1's name
    ],
)
def test_anything_else_is_unauthorized(header: str | None) -> None:
    with pytest.raises(Unauthorized):
        verify_token(SECRET, header)


def test_identities_and_secrets_are_validated() -> None:
    with pytest.raises(ConfigError, match="identity"):
        derive_token(SECRET, "no spaces allowed")
    with pytest.raises(ConfigError, match="identity"):  # nor a trailing newline, which Python's "$" lets through
        check_identity("east\n")
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        read_secret("abcd")
    with pytest.raises(ConfigError, match="hex"):
        read_secret("zz" * 32)
    assert read_secret(SECRET.hex() + "\n") == SECRET
