"""The learner's incoming side: every new fragment version, from the shards' streams or the region's relay.

Without a relay a learner keeps one stream open to each shard. With one
(``relay/``: a region with several learners pulls each version into the region
once), it keeps a single stream to the relay, and the shards' streams stand by:
they stay closed while the relay delivers and open the moment it does not (it
is gone, or it says its own streams from the shards broke), so a relay that
fails costs a reconnect, never a version. A version arriving by both ways is
adopted once (``versions`` holds the newest of each fragment).

While its relay does not answer, the learner asks the shards in turn where the
region's relay is now (``GET /v1/relay``, at most every ``LOCATE_EVERY_S``) and
moves to an address one says, so a relay whose host was replaced by a machine at another
address serves the learners started before it again. A relay URL with no host
(``https://:PORT``: a learner started while its relay's host was down) is not
dialled: the shards are asked from the start, and the relay serves the learner
once a shard knows where it is.

The relay forwards whole versions (it holds no learner's chain of deltas), so
a version adopted through it is not a base the shard may send a delta from:
the learner forgets that fragment's delta base, and a delta it is then sent
anyway is refused, and its stream asks again for whole versions.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import torch

from ddctl_agents import relay
from ddctl_agents.agent.client import Refused, SyncerClient, Unavailable
from ddctl_agents.core.fragments import TensorSpec
from ddctl_agents.core.messages import FragmentVersion
from ddctl_agents.core.text import printable
from ddctl_agents.core.version_delta import Held, receive
from ddctl_agents.errors import WireError
from ddctl_agents.service import history

log = logging.getLogger(__name__)
FIRST_DELAY_S, MOST_DELAY_S = 0.1, 5.0
"""A broken stream is reopened after 0.1 s, doubling to 5 s while it keeps breaking."""
RELAY_FIRST_S = 5.0
"""At the start the shards' streams wait this long at most for the relay's first answer (a record or a refusal), so
a learner behind a working relay never pulls the bootstrap versions across the region's link twice."""


LOCATE_EVERY_S = 5.0
"""While the relay does not answer, a shard is asked where it is at most this often."""
MOST_AHEAD = 2**20
"""How far past the version held a fragment's next may be numbered, where the job's length is not known (the relay; a
learner before its loop starts). A version is one round of that fragment, and a round takes at least one update, so
2**20 is 16384 sends of each of 64 learners missed: far past any disconnection a learner survives. A version beyond it
is a broken or hostile peer's, and holding it would make every real version look old (the fragment would freeze)."""


def implausible(held: int, version: int, most_ahead: int = MOST_AHEAD) -> str:
    """Why ``version`` cannot follow ``held`` (-1: none yet, when any version is the first), or ""."""
    if held >= 0 and version - held > most_ahead:
        return f"version {version} is more than {most_ahead} rounds ahead of the one held ({held})"
    return ""


def fits(message: FragmentVersion, specs: Sequence[TensorSpec]) -> None:
    """Raise WireError unless ``message`` holds exactly the fragment's tensors, each floating and of its shape: adopting
    one that does not would end the training loop (a missing name) or overwrite weights laid out wrongly (a shape)."""
    want = {spec.name: spec.shape for spec in specs}
    if set(message.tensors) != set(want):
        missing, extra = sorted(set(want) - set(message.tensors)), sorted(set(message.tensors) - set(want))
        lacks, adds = printable(", ".join(missing[:3]), 120), printable(", ".join(extra[:3]), 120)
        raise WireError(
            f"a version of fragment {message.fragment} with other tensors than the fragment's: "
            f"missing {lacks} ({len(missing)}), unknown {adds} ({len(extra)})"
        )
    for name, shape in want.items():
        t = message.tensors[name]
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or tuple(t.shape) != shape:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            what = f"fragment {message.fragment}'s tensor {printable(name, 120)}"
            raise WireError(f"{what} is float {shape}, got {printable(got, 120)}")


@dataclass(slots=True)
class RelayLink:
    """The region's relay: where this learner reaches it now, and how (its certificate is checked by its region's name,
    whatever the address)."""

    url: str
    connect: Callable[[str], SyncerClient]


class Counted(Protocol):
    """Where the bytes that came down are counted (the comms' ledger, under its lock)."""

    def came_down(self, nbytes: int) -> None: ...


class Subscriber:
    """See the module docstring. ``heard(url)``: a shard answered (the dead-man switch's clock)."""

    def __init__(
        self,
        connect: Callable[[str], SyncerClient],
        cadence: int,
        stopping: threading.Event,
        heard: Callable[[str], None],
        counted: Counted,
        relay: RelayLink | None = None,
    ) -> None:
        self.connect, self.cadence, self.stopping, self.heard, self.counted = connect, cadence, stopping, heard, counted
        self.relay = relay
        self.versions: list[int] = []
        self.held: dict[int, Held] = {}
        """Each fragment's newest version as received, where the shard sends deltas from it (``core/version_delta``)."""
        self.inbox: queue.Queue[FragmentVersion] = queue.Queue()
        self.relayed = threading.Event()
        """Set while the relay's stream delivers: the shards' streams stand by."""
        self.relay_answered = threading.Event()
        """Set once the relay has delivered or failed for the first time."""
        self.specs: tuple[tuple[TensorSpec, ...], ...] | None = None
        """Each fragment's tensors, once known (``expect``): a version of others is refused before it is queued."""
        self.most_ahead = MOST_AHEAD
        self.refused = 0
        """Versions refused here (other tensors, numbered implausibly far ahead)."""
        self.histories: dict[str, str] = {}
        """The history each shard's versions count in (by URL), as its first stream named it."""
        self.agreed: set[tuple[str, str]] = set()
        """(relay URL, shard URL): the relay listed the shard's history as this learner knew it (``_listed``)."""
        self.why_relay_refused = ""
        self.started_over = threading.Event()
        """Set once the versions held can never be continued (``agent/again.py``), with why in ``why_over``."""
        self.why_over = ""

    def expect(self, specs: tuple[tuple[TensorSpec, ...], ...], most_ahead: int) -> None:
        """From now on refuse a version whose tensors are not its fragment's, or numbered more than ``most_ahead``
        past the one held (the job's bound: ``loop.most_ahead``)."""
        self.specs, self.most_ahead = specs, most_ahead

    def loops(self, urls: list[str]) -> list[tuple[str, Callable[[], None]]]:
        """The threads to run: one stream per shard, and the relay's when there is one."""
        direct: list[tuple[str, Callable[[], None]]] = [("subscribe", functools.partial(self.direct, url)) for url in urls]
        return direct + ([("relay", functools.partial(self.via_relay, urls))] if self.relay is not None else [])

    def direct(self, url: str) -> None:
        """A shard's stream, kept open while the relay (if any) does not deliver."""
        client, delay, chain = self.connect(url), FIRST_DELAY_S, [""]  # chain: the shard's chain of versions, once it says
        if self.relay is not None:
            self.relay_answered.wait(RELAY_FIRST_S)
        try:
            while not self.stopping.is_set():
                if self.relayed.is_set():
                    self.stopping.wait(0.2)
                    continue
                try:
                    for frame in client.fragments(list(self.versions), chain, opened=functools.partial(self._opened, url)):
                        self.heard(url)
                        delay = FIRST_DELAY_S
                        if self.stopping.is_set() or self.relayed.is_set():
                            break  # leaving the loop closes the stream
                        if frame:
                            self._take(frame, keep_base=bool(chain[0]) and self.cadence == 1)
                except (Unavailable, Refused, WireError) as exc:
                    log.info("fragment stream: %s; reconnecting", exc)
                    if isinstance(exc, WireError):  # a frame it cannot read, or a delta from what it does not hold
                        chain[0] = ""  # whole versions from here
                    self.stopping.wait(delay)
                    delay = min(delay * 2, MOST_DELAY_S)
        finally:
            client.close()

    def via_relay(self, shards: list[str]) -> None:
        """The relay's stream; while it is down the shards' streams take over, it is tried again, and a shard is asked
        whether it has moved."""
        link = self.relay
        assert link is not None
        client: SyncerClient | None = None
        delay, asked = FIRST_DELAY_S, -LOCATE_EVERY_S
        try:
            while not self.stopping.is_set():
                try:
                    if not urlsplit(link.url).hostname:
                        raise Unavailable("where the region's relay is is not known yet")
                    client = client or link.connect(link.url)
                    listed = functools.partial(self._listed, shards, link.url)
                    for frame in client.fragments(list(self.versions), listed=listed):
                        if not self.relayed.is_set():
                            log.info("the region's relay delivers: the shards' streams stand by")
                            self.relayed.set()
                            self.relay_answered.set()
                        delay = FIRST_DELAY_S
                        if self.stopping.is_set():
                            return
                        if frame:
                            self._take(frame, keep_base=False)
                    raise Unavailable("the relay ended its stream")  # it does when its own streams from the shards broke
                except (Unavailable, Refused, WireError) as exc:
                    if self.relayed.is_set():
                        log.warning("relay: %s; pulling from the shards until it is back", exc)
                    self.relayed.clear()
                    self.relay_answered.set()
                    if time.monotonic() - asked >= LOCATE_EVERY_S and shards:
                        asked = time.monotonic()
                        if moved := self._moved(link.url, shards):
                            log.info("the region's relay is now at %s (it was at %s)", moved, link.url)
                            if client is not None:
                                client.close()
                            client, link.url, delay = None, moved, 0.0
                    self.stopping.wait(delay)
                    delay = min(max(delay * 2, FIRST_DELAY_S), MOST_DELAY_S)
        finally:
            self.relayed.clear()
            if client is not None:
                client.close()

    def lost(self, why: str) -> None:
        """The versions held will never be continued (the first ``why`` is kept): the learner starts over."""
        if not self.started_over.is_set():
            self.why_over = why
            log.warning("%s", why)
            self.started_over.set()

    def _opened(self, url: str, said: str, via: str = "") -> None:
        """A shard's stream opened naming the history of its versions (or the relay's at ``via`` named it): another
        than before means that shard started over."""
        if known := history.changed(self.histories, url, said):  # the one held stays named: this life's updates are of it
            where = f"{url} (as the relay at {via} lists it)" if via else url
            self.lost(f"the synchronizer at {where} started over: its versions count in history {said}, the ones held "
                      f"here in {known}, which it will never continue")  # fmt: skip

    def registered(self, url: str, said: object) -> None:
        """Shard ``url`` named its history as this learner registered (its answer's ``history``, where it is one):
        known first-hand, and another than before means that shard started over."""
        if isinstance(said, str):  # its form is checked where it is compared
            self._opened(url, said)

    def _listed(self, shards: list[str], relay_url: str, text: str) -> None:
        """The relay's stream lists each shard's history: kept as if read from the shard (this learner's updates and
        heartbeats name it). A relay whose list disagrees with what this learner knows first-hand, before it has
        once agreed, is most likely one that has not heard that shard since it started over (its stream from it broke,
        and the versions it serves are the old history's): its stream is refused, and the shard's own takes over and
        says which history is the shard's (one it names anew ends this life) until the relay agrees. Once it has
        agreed, another means the relay heard that shard start over."""
        lists = history.listed(text, shards)
        for url, said in lists.items():
            known = self.histories.get(url)
            if known and said != known and (relay_url, url) not in self.agreed:
                disagree = (f"the relay at {relay_url} lists history {said} for {url}, which named {known} itself: "
                            "the shard's own stream is read until they agree")  # fmt: skip
                if disagree != self.why_relay_refused:  # said once: it is asked again every few seconds until it agrees
                    self.why_relay_refused = disagree
                    log.info("%s", disagree)
                raise Unavailable(disagree)
        for url, said in lists.items():
            self._opened(url, said, via=relay_url)
            self.agreed.add((relay_url, url))

    def _moved(self, url: str, shards: list[str]) -> str:
        """The relay's URL as the first shard that knows says it is now, where that differs from ``url``; "" when it
        does not, or no shard knows (each is asked in turn: one that is down or has no stream from the relay does not
        keep the learner from finding it). Over plain text no certificate checks the relay's region, so a shard's
        word moves the learner (and its token) only to a loopback address, where a plaintext relay can be."""
        for shard in shards:
            client = self.connect(shard)
            try:
                at = client.relay_address()
            except (Unavailable, Refused) as exc:
                log.debug("where the relay is, from %s: %s", shard, exc)
                continue
            finally:
                client.close()
            if at and urlsplit(url).scheme == "http" and not relay.on_loopback(at):  # no certificate names the region
                log.warning("%s says the relay is at %s: a plaintext relay serves on loopback only; not followed", shard, at)
                continue
            if at:
                now = f"{urlsplit(url).scheme}://{at}"
                return now if now != url else ""
        return ""

    def _take(self, frame: bytes, keep_base: bool) -> None:
        """Decode a frame and queue its version if it is newer than the fragment's held or queued one (a duplicate, or
        one that came both ways, is not queued twice); ``keep_base``: the shard may send the next one as a delta from
        it. A version that cannot be adopted is a WireError: the stream asks again, for whole versions."""
        message, held = receive(frame, self.held)
        self.counted.came_down(len(frame))
        p = message.fragment
        if not 0 <= p < len(self.versions):
            raise WireError(f"a version of fragment {p}; this job's fragments are 0 to {len(self.versions) - 1}")
        if message.version <= self.versions[p]:
            return
        try:
            if why := implausible(self.versions[p], message.version, self.most_ahead):
                raise WireError(f"fragment {p}: {why}")
            if self.specs is not None:
                fits(message, self.specs[p] if p < len(self.specs) else ())
        except WireError:
            self.refused += 1
            raise
        self.versions[p] = message.version
        if keep_base:
            self.held[p] = held
        else:
            self.held.pop(p, None)
        self.inbox.put(message)
