"""The relay's side facing the synchronizer: one stream from each shard, every version published for the region.

Each shard's stream runs on a thread of its own (the learners' own client,
``agent/client.SyncerClient``), asking for what the relay does not hold yet,
so a reconnect resends nothing already here. What a shard sends is checked
before it is served on (sizes, checksum, header and tensor table; its tensors
are not decoded): a frame that is not a whole fragment version, or names a
fragment the job does not have, or a version numbered implausibly far past the one held
(``subscription.MOST_AHEAD``), is counted and dropped,
and the stream goes on. A shard whose stream names another history than before
(``service/history.py``: it started over) makes the relay forget every version it
holds and ask every shard again from none; its learners' streams end, and open
again listing each shard's history (``history.LISTED``), so that they start over
too. A shard not heard from (not even a keep-alive) for ``stale_after_s`` makes
the relay *stale*: its learners are refused (503) and pull from the shards
themselves until it hears again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ddctl_agents.agent.client import Refused, SyncerClient, Unavailable
from ddctl_agents.agent.subscription import implausible
from ddctl_agents.core.messages import fragment_of
from ddctl_agents.errors import WireError
from ddctl_agents.service import history
from ddctl_agents.service.publisher import Published, Publisher

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FeedCounts:
    """What came from the shards: the relay's whole cost on the region's link, and what it refused."""

    frames: int = 0
    bytes_in: int = 0
    refused: int = 0


class Feed:
    def __init__(
        self,
        urls: Sequence[str],
        connect: Callable[[str], SyncerClient],
        publisher: Publisher,
        fragments: int,
        stale_after_s: float,
        clock: Callable[[], float] = time.monotonic,
        at: str = "",
    ) -> None:
        """``at``: where the region's learners reach this relay, which it tells each shard (``relay.address``)."""
        self.urls, self.connect, self.publisher, self.fragments, self.at = list(urls), connect, publisher, fragments, at
        self.stale_after_s, self.clock = stale_after_s, clock
        self.counts = FeedCounts()
        self.started = clock()
        self.heard: dict[str, float | None] = dict.fromkeys(self.urls)
        """When each shard's stream last delivered a record (None: not yet)."""
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.histories: dict[str, str] = {}
        """The history each shard's versions count in, as its stream last named it."""
        self.forgotten = 0
        """Times the relay forgot what it held because a shard started over: each stream opened before asks again."""

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """One thread per shard, publishing into ``loop`` (the one serving the learners)."""
        for n, url in enumerate(self.urls):
            thread = threading.Thread(target=self._follow, args=(url, loop), name=f"ddctl-relay-feed-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self.stopping.set()

    def stale(self) -> str:
        """Why the relay cannot serve now (a shard unheard for too long), or "" when every shard's stream delivers."""
        now = self.clock()
        for url, heard in self.heard.items():
            since = now - (self.started if heard is None else heard)
            if since > self.stale_after_s:
                what = "not heard from yet" if heard is None else "silent"
                return f"shard {url} {what} for {since:.1f} s (limit {self.stale_after_s:g} s)"
        return ""

    def _follow(self, url: str, loop: asyncio.AbstractEventLoop) -> None:
        """Shard ``url``'s stream, reconnected with backoff: the log says when it broke and when it came back, once each."""
        client, delay, outage = self.connect(url), 0.1, Outage()
        try:
            while not self.stopping.is_set():
                try:
                    opened, forgotten = functools.partial(self._opened, url, loop), self.forgotten
                    for frame in client.fragments(self.publisher.versions(), at=self.at, opened=opened):
                        if self.forgotten != forgotten:
                            break  # asked for what the relay held before it forgot: ask again, from none
                        self.heard[url] = self.clock()
                        delay = 0.1
                        outage.over(url, self.clock())
                        if self.stopping.is_set():
                            return
                        if frame:
                            self._publish(url, frame, loop)
                except (Unavailable, Refused) as exc:
                    outage.failed(url, exc, self.clock())
                    self.stopping.wait(delay)
                    delay = min(delay * 2, 5.0)
        finally:
            client.close()

    def _opened(self, url: str, loop: asyncio.AbstractEventLoop, said: str) -> None:
        """Shard ``url``'s stream names the history of its versions: another than before, and nothing held counts."""
        if known := history.changed(self.histories, url, said):
            self.histories[url] = said  # what it holds from now on counts in the new one
            log.warning("shard %s started over (history %s, was %s): the relay forgets every version it holds", url, said,
                        known)  # fmt: skip
            asyncio.run_coroutine_threadsafe(self.publisher.forget(), loop).result()
            self.forgotten += 1

    def _publish(self, url: str, frame: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.counts.bytes_in += len(frame)
        try:
            fragment, version = fragment_of(frame)
            if not 0 <= fragment < self.fragments:
                raise WireError(f"fragment {fragment}; this job's fragments are 0 to {self.fragments - 1}")
            if why := implausible(self.publisher.versions()[fragment], version):  # held, it would hide every real one
                raise WireError(f"fragment {fragment}: {why}")
        except WireError as exc:
            self.counts.refused += 1
            log.warning("dropped a frame from %s: %s", url, exc)
            return
        self.counts.frames += 1
        item = Published(fragment=fragment, version=version, frame=frame)
        asyncio.run_coroutine_threadsafe(self.publisher.publish(item), loop).result()


@dataclass(slots=True)
class Outage:
    """A shard's stream while it fails: one warning as it breaks, one line as it is back, the tries between at debug."""

    since: float | None = None
    tries: int = 0

    def failed(self, url: str, exc: Exception, now: float) -> None:
        self.tries += 1
        if self.since is None:
            self.since = now
            log.warning("stream from %s: %s; reconnecting", url, exc)
        else:
            log.debug("stream from %s: %s (try %d)", url, exc, self.tries)

    def over(self, url: str, now: float) -> None:
        if self.since is not None:
            log.info("stream from %s back after %.1f s (%d failed tries)", url, now - self.since, self.tries)
            self.since, self.tries = None, 0
