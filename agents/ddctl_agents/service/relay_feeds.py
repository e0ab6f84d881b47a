"""The regional relays that pull from this synchronizer: what ``/v1/status`` says of each (``relays``).

A relay reads the fragment stream as ``relay-REGION`` (``relay.identity``), so the
stream handler knows one when it sees one. Each is shown by its region: its
streams open now (one per relay; 0 once it has gone), the bytes sent to it, and
how long since the last record or keep-alive went to it. A learner behind a relay
is not a subscriber here: this is where its region's traffic shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddctl_agents.relay import region_of


@dataclass(slots=True)
class RelayFeed:
    streams: int = 0
    bytes: int = 0
    last_seen: float = 0.0


class RelayFeeds:
    """Each relay's stream, by region, as the stream handler opens, feeds and closes it (one event loop: no lock)."""

    def __init__(self) -> None:
        self.feeds: dict[str, RelayFeed] = {}

    @staticmethod
    def region(identity: str) -> str | None:
        """The region whose relay ``identity`` is, or None for a learner (or the admin)."""
        return region_of(identity)

    def opened(self, region: str, now: float) -> None:
        feed = self.feeds.setdefault(region, RelayFeed())
        feed.streams += 1
        feed.last_seen = now

    def sent(self, region: str, size: int, now: float) -> None:
        feed = self.feeds.setdefault(region, RelayFeed())
        feed.bytes += size
        feed.last_seen = now

    def closed(self, region: str, now: float) -> None:
        feed = self.feeds.setdefault(region, RelayFeed())
        feed.streams = max(feed.streams - 1, 0)
        feed.last_seen = now

    def view(self, now: float) -> dict[str, dict[str, Any]]:
        return {
            region: {"streams": f.streams, "bytes": f.bytes, "seen_s_ago": round(max(now - f.last_seen, 0.0), 3)}
            for region, f in sorted(self.feeds.items())
        }
