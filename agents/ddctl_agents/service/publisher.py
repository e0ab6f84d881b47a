"""The newest encoded version of every fragment, and subscribers waiting for newer ones.

A slow subscriber never builds a queue: it is sent the newest version of each
fragment it has not seen yet, so memory stays bounded by one encoded copy per
fragment whatever the number of learners or their speed. What it has not seen
goes oldest first (in the order the versions were made, which is the order
their fragments fell due), not in fragment order: on a slow downlink the
version that has waited longest is the one a learner is most behind on.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ddctl_agents.core.choices import DEFAULT_BLOCK
from ddctl_agents.core.messages import FragmentVersion
from ddctl_agents.core.version_delta import Chains, Exact, Whole, pick

Wanted = Callable[[int, int, int], bool]
"""(fragment, version, the version the subscriber holds) -> send it? (``core/holds.py``)"""


@dataclass(frozen=True, slots=True)
class Published:
    fragment: int
    version: int
    frame: bytes
    """The version whole (bf16 where it is a delta chain's: what a learner at cadence k > 1 adopts)."""
    exact: Exact | None = None
    """A delta chain's version whole, exactly as the learners following it hold it (its frame made on first use)."""
    delta: bytes | None = None
    """The version as a step from version ``base`` (``core/version_delta.py``), for a subscriber holding that one."""
    base: int = -1

    async def whole(self) -> bytes:
        return self.frame if self.exact is None else await _made(self.exact)

    async def frame_for(self, holds: int, rounded: bool) -> bytes:
        chosen = pick(self.frame, self.exact, self.delta, self.base, holds, rounded)
        return await _made(chosen) if isinstance(chosen, Exact) else chosen


async def _made(exact: Exact) -> bytes:
    """An exact frame, encoded on a worker thread the first time (a large fragment's fp32 takes a while)."""
    return exact.frame() if exact.ready else await asyncio.to_thread(exact.frame)


class Publisher:
    def __init__(self, count: int, versions: Whole | Chains | None = None) -> None:
        self.coder = versions or Whole("bf16", DEFAULT_BLOCK, adopted=False)
        """How versions are coded; a delta chain steps one version at a time, so coding takes ``_coding``."""
        self._coding = threading.Lock()
        self.chain = secrets.token_hex(8) if isinstance(self.coder, Chains) else ""
        """This process's chain of versions: a subscriber's deltas step from what it holds only if it is of this one."""
        self.history = ""
        """The history its version numbers count in (``service/history.py``; set as the syncer starts)."""
        self.latest: list[Published | None] = [None] * count
        self._made: list[int] = [0] * count
        """When each fragment's newest version was published (a counter): the order subscribers are sent them in."""
        self._count = 0
        self._changed = asyncio.Condition()
        self._forgets = 0
        self.closed = False

    def code(self, message: FragmentVersion) -> Published:
        """``message`` as it is sent: whole, and as a delta where the down codec makes them (on a worker thread)."""
        with self._coding:
            coded = self.coder.code(message)
        p, version = message.fragment, message.version
        return Published(fragment=p, version=version, frame=coded.key, exact=coded.exact, delta=coded.delta, base=coded.base)

    async def publish(self, item: Published) -> None:
        async with self._changed:
            current = self.latest[item.fragment]
            if current is not None and current.version >= item.version:
                return
            self.latest[item.fragment] = item
            self._count += 1
            self._made[item.fragment] = self._count
            self._changed.notify_all()

    async def forget(self) -> None:
        """Hold no version (a relay whose shard started over: its versions count in a history the old ones do not);
        every stream following ends, since what it was sent counts in that old history."""
        async with self._changed:
            self.latest = [None] * len(self.latest)
            self._forgets += 1
            self._changed.notify_all()

    def get(self, fragment: int) -> Published | None:
        return self.latest[fragment]

    def versions(self) -> list[int]:
        return [-1 if item is None else item.version for item in self.latest]

    async def close(self) -> None:
        self.closed = True
        await self.nudge()

    async def nudge(self) -> None:
        """Wake every subscriber to look again (what one of them wants changed, not the versions)."""
        async with self._changed:
            self._changed.notify_all()

    async def follow(self, since: list[int], keepalive_s: float, wanted: Wanted | None = None) -> AsyncIterator[Published | None]:
        """Yield every fragment newer than ``since`` as it appears (those ``wanted`` says); ``None`` after
        ``keepalive_s`` of quiet. Ends when the publisher closes or forgets what it held."""
        seen, forgets = list(since), self._forgets
        while not self.closed and self._forgets == forgets:
            quiet = False
            async with self._changed:
                fresh = self._newer(seen, wanted)
                if not fresh:
                    try:
                        async with asyncio.timeout(keepalive_s):  # not wait_for: it can swallow a cancel on 3.11
                            await self._changed.wait()
                    except TimeoutError:
                        quiet = True
                    fresh = self._newer(seen, wanted)
            for item in fresh:
                seen[item.fragment] = item.version
                yield item
            if quiet and not fresh:
                yield None

    def _newer(self, seen: list[int], wanted: Wanted | None) -> list[Published]:
        fresh = [
            item
            for item in self.latest
            if item is not None
            and item.version > seen[item.fragment]
            and (wanted is None or wanted(item.fragment, item.version, seen[item.fragment]))
        ]
        return sorted(fresh, key=lambda item: self._made[item.fragment])
