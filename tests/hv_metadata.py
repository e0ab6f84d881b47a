"""The test hypervisor's instance metadata server at 169.254.169.254: the docker provider's IMDSv2 handler (tokens,
spot notices), EC2's rebalance recommendation, and GCE's metadata paths for the GCP guests (``gcp_guests.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddctl.providers.docker import metadata
from gcp_guests import GcpGuests

IMDS_ADDRESS = "169.254.169.254"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"


def metadata_handler(notices: metadata.Notices, rebalance_at: Callable[[str], str | None], guests: GcpGuests | None) -> type:
    """The docker provider's IMDSv2 handler (tokens, spot notices), EC2's rebalance recommendation, GCE's paths."""
    tokens = metadata.Tokens()
    base: Any = metadata.make_handler(notices, tokens)

    class Handler(base):  # type: ignore[misc]
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            gce = guests.answer(self.path, self.client_address[0], self.headers.get("Metadata-Flavor", "")) if guests else None
            if gce is not None:
                body = gce[1].encode()
                self.send_response(gce[0])
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Metadata-Flavor", "Google")
                self.end_headers()
                self.wfile.write(body)
            elif self.path != REBALANCE_PATH:
                super().do_GET()
            elif not tokens.valid(self.headers.get("X-aws-ec2-metadata-token", "")):
                self._send(401)
            elif (when := rebalance_at(self.client_address[0])) is None:
                self._send(404)
            else:
                self._send(200, {"noticeTime": when})

    return Handler
