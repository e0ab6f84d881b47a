"""Real GCP, behind a marker: only with Application Default Credentials and ``DDCTL_GCP_SMOKE=1``.

``-m cloud`` selects these; without them they skip saying so. Everything here is read-only (zones, the
default network, the plan's prices): nothing is made and nothing is spent.
"""

from __future__ import annotations

import os

import pytest

from ddctl.providers.gcp.clients import CALL_TIMEOUT_S, Clients
from ddctl.providers.gcp.provider import GcpProvider


def _why_not() -> str | None:
    if os.environ.get("DDCTL_GCP_SMOKE") != "1":
        return "real-cloud smoke test: set DDCTL_GCP_SMOKE=1 (and Application Default Credentials) to run it against GCP"
    if os.environ.get("DDCTL_GCP_ENDPOINT"):
        return "real-cloud smoke test: DDCTL_GCP_ENDPOINT points at another Compute API; unset it"
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        google.auth.default()
    except DefaultCredentialsError as exc:
        return f"real-cloud smoke test: no Application Default Credentials ({exc})"
    return None


pytestmark = [pytest.mark.cloud, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


def test_zones_and_the_default_network_are_read_read_only() -> None:
    clients = Clients()
    project = clients.project()
    zones = GcpProvider(clients).zones(project, "us-central1", [])
    assert zones and all(z.startswith("us-central1-") for z in zones)
    network = clients.client("NetworksClient").get(project=project, network="default", timeout=CALL_TIMEOUT_S)
    assert network.name == "default"
