"""Who reads the fragment stream here: the regional relays, by region, and the learners that read it themselves.

A relay reads the fragment stream as ``relay-REGION`` (``relay.identity``), so the
stream handler knows one when it sees one, and says where its learners reach it
(``at=``), which a learner whose relay moved asks for (``GET /v1/relay``). Each is shown by its region on
``/v1/status`` (``relays``): its streams open now (one per relay; 0 once it has
gone), the bytes sent to it, and how long since the last record or keep-alive went
to it. A learner behind a relay is not a subscriber here, so its downlink is
measured on its relay's stream: the version crosses its region's link there, and
the hop from the relay is inside the region. Without that, the grace window knew
no downlink for relayed learners and read the network slack from the others only
(a tiny-preset ``up`` with three learners behind a 20 Mbit/s link: val_bpb 0.07
and 0.11 worse than without the relay, in two pairs of runs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ddctl_agents.core.links import LearnerLinks


@dataclass(slots=True)
class RelayFeed:
    streams: int = 0
    bytes: int = 0
    last_seen: float = 0.0
    address: str = ""
    """Where the region's learners reach the relay, as its newest stream said (``relay.address``)."""


class RelayFeeds:
    """Each relay's stream, by region, as the stream handler opens, feeds and closes it (one event loop: no lock)."""

    def __init__(self) -> None:
        self.feeds: dict[str, RelayFeed] = {}
        self.direct: Counter[str] = Counter()
        """Each learner's fragment streams open here (its own: while it has one, it is not behind its relay)."""

    def opened(self, region: str, now: float, address: str = "") -> None:
        feed = self._heard(region, now)
        feed.streams += 1
        feed.address = address or feed.address

    def located(self, region: str) -> str:
        """Where region ``region``'s relay is now, for a learner whose relay stopped answering: "" while none streams
        from here (a relay gone is not an address to dial)."""
        feed = self.feeds.get(region)
        return feed.address if feed is not None and feed.streams else ""

    def sent(self, region: str, size: int, now: float) -> None:
        self._heard(region, now).bytes += size

    def closed(self, region: str, now: float) -> None:
        feed = self._heard(region, now)
        feed.streams = max(feed.streams - 1, 0)

    def _heard(self, region: str, now: float) -> RelayFeed:
        """Region ``region``'s feed, last heard from ``now``."""
        feed = self.feeds.setdefault(region, RelayFeed())
        feed.last_seen = now
        return feed

    def view(self, now: float, learners: Mapping[str, Placed], live: Container[str]) -> dict[str, dict[str, Any]]:
        """Each relay for ``/v1/status``; ``learners`` and ``live`` as ``serving`` takes them (on the core thread)."""
        return {
            region: {
                "streams": f.streams,
                "bytes": f.bytes,
                "seen_s_ago": round(max(now - f.last_seen, 0.0), 3),
                "address": f.address,  # where it said its learners reach it (a relay that has gone: where it was)
                "learners": self.serving(region, learners, live),
            }
            for region, f in sorted(self.feeds.items())
        }

    def serving(self, region: str, learners: Mapping[str, Placed], live: Container[str]) -> int:
        """How many learners read through region ``region``'s relay now: those ``behind`` it while its stream is open
        (with none open they are not reading it, whatever stream they lack here)."""
        feed = self.feeds.get(region)
        return len(self.behind(region, learners, live)) if feed is not None and feed.streams else 0

    def behind(self, region: str, learners: Mapping[str, Placed], live: Container[str]) -> list[str]:
        """The live learners of ``region`` that read no stream here: they are behind its relay."""
        return sorted(n for n, info in learners.items() if info.region == region and n in live and not self.direct.get(n))

    def observe(
        self,
        region: str,
        learners: Mapping[str, Placed],
        live: Container[str],
        links: dict[str, LearnerLinks],
        nbytes: int,
        seconds: float,
        kernel: bool,
    ) -> None:
        """A sample of relay ``region``'s downlink, taken as the downlink of each learner behind it (``behind``)."""
        for name in self.behind(region, learners, live):
            links.setdefault(name, LearnerLinks()).down.observe(nbytes, seconds, kernel=kernel)


class Placed(Protocol):
    """What a learner's record says of where it is (``roster.LearnerInfo``)."""

    region: str
