"""The learner's network side: three threads beside the training loop, which never waits on them.

- uploaders: encode each outer gradient and push it until the syncer
  acknowledges it (retrying through syncer restarts; re-registering if the
  syncer forgot us). A fixed number are in flight, or as few as keep the
  measured uplink busy (``agent/slots``): several keep the link busy while the
  syncer decodes and fsyncs the previous one (one at a time reached 88% of a
  tbf-shaped link, three 94%: docs/benchmarks.md), but they share it, so the
  update due first waits for the others;
- subscriber: keeps the fragment stream open and queues every new version for
  the training loop to adopt between steps (from the region's relay where it
  has one: ``agent/subscription``);
- heartbeat: reports progress and measured link figures every ``interval_s``.

The uplink is measured where its bytes move: each upload is timed by this
machine's kernel (bytes acknowledged over the connection's busy time, read from
``TCP_INFO`` before and after it); only uploads that had the link to themselves
count (``core.links.SoloTransfers``). The downlink is the syncer's to measure,
from its own sockets: a reading thread would time its own wake-up, not the wire.

Each thread has its own HTTP/2 connection, so a long upload never delays a
heartbeat or an incoming fragment. A sharded synchronizer (``agent/routes.py``)
gets a subscriber and a heartbeat per shard, and each update goes to its
fragment's owner; a shard silent for longer than the dead-man switch's limit
counts as the synchronizer gone, since its fragments can no longer be synced.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddctl_agents.agent.client import Refused, SyncerClient, Unavailable, retry
from ddctl_agents.agent.routes import Routes
from ddctl_agents.agent.slots import UploadSlots
from ddctl_agents.agent.subscription import RelayLink, Subscriber
from ddctl_agents.core.effects import ACK_STATUSES
from ddctl_agents.core.links import SoloTransfers, sent_between
from ddctl_agents.core.messages import FragmentVersion, Update, absorb, encode_update
from ddctl_agents.core.text import printable
from ddctl_agents.core.wire import is_count
from ddctl_agents.errors import HTTP, AgentError, ConfigError, ImpossibleVersion, JobOver, NotOwner

log = logging.getLogger(__name__)
JOB_OVER = HTTP[JobOver][1]
"""The syncer's code for a request it refuses because the job is finishing or finished."""
NOT_OWNER = HTTP[NotOwner][1]
"""A shard's code for an update of a fragment it does not own (the map moved it)."""
IMPOSSIBLE_VERSION = HTTP[ImpossibleVersion][1]
"""The code for an update based on a version the syncer never produced: the syncer started over (``agent/again``)."""
SUSPENDED_RETRY_S = 10.0
"""How often a suspended learner asks again whether it has been readmitted."""


@dataclass(slots=True)
class CommLedger:
    """Fragment-tokens by fate, as the learner sees them."""

    sent: int = 0
    """Handed to the uploader."""
    acked: dict[str, int] = field(default_factory=dict)
    """By the syncer's answer: accepted, late, dropped, duplicate."""
    rejected: int = 0
    """Refused with a 4xx: never applied."""
    absorbed: int = 0
    """Updates that a queued, unsent update of the same fragment absorbed (one upload instead of two)."""
    bytes_up: int = 0
    bytes_down: int = 0

    def acked_total(self) -> int:
        return sum(self.acked.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    name: str
    incarnation: int
    region: str
    cadence: int = 1
    """It sends each fragment every ``cadence`` periods (the syncer sends it only the versions it adopts)."""


def acknowledged(push: Callable[[bytes, int], dict[str, Any]], frame: bytes, update: Update) -> dict[str, Any]:
    """``push``'s answer if it says what became of the update; otherwise Unavailable, so the update is sent again
    (the synchronizer knows its id: a copy that arrived is a duplicate) and no made-up status enters the ledger."""
    ack = push(frame, update.fragment)
    if ack.get("status") not in ACK_STATUSES:
        shown = printable(repr(ack.get("status")), 60)
        raise Unavailable(f"update {update.update_id} answered with status {shown}, not one of {', '.join(ACK_STATUSES)}")
    return ack


class Comms:
    """See the module docstring. ``connect`` makes a fresh client (one per thread)."""

    def __init__(
        self,
        connect: Callable[[str], SyncerClient],
        routes: Routes,
        me: Identity,
        codec: str,
        block: int,
        interval_s: float = 0.5,
        parallel_uploads: int | None = None,
        absorb: bool = True,
        relay: RelayLink | None = None,
    ) -> None:
        """``absorb``: a queued update of a fragment takes in a newer one of the same base (off with error feedback,
        whose residuals assume every drift was encoded on its own). ``parallel_uploads``: that many in flight, or (None)
        as few as keep the measured uplink busy (``agent/slots``). ``relay``: connects to the region's relay, which
        then brings the versions (``agent/subscription``)."""
        self.connect, self.me, self.codec, self.block, self.interval_s = connect, me, codec, block, interval_s
        self.routes = routes
        self.slots, self.absorb = UploadSlots(parallel_uploads), absorb
        self._timings: dict[int, tuple[tuple[int, float] | None, bool]] = {}
        """Per uploader thread, its last acknowledged push's kernel timing and whether it had the link alone."""
        self.outbox: queue.Queue[Update] = queue.Queue()
        self.ledger = CommLedger()
        self.report: dict[str, Any] = {}
        self.stopping = threading.Event()
        self.subscriber = Subscriber(connect, me.cadence, self.stopping, self._heard, self, relay)
        self.inbox = self.subscriber.inbox
        self._idle = threading.Condition()
        self._busy = 0
        self._lock = threading.Lock()
        self._uplink = SoloTransfers()
        self._up: dict[str, tuple[int, float]] = {}
        """The latest kernel-timed uplink sample (bytes, seconds) not yet reported, per shard's heartbeat: samples are
        not summed, since one upload that went well and one that did not would average into a figure neither was."""
        self._rtt: float | None = None
        self._threads: list[threading.Thread] = []
        self._streams: list[threading.Thread] = []
        self.register_answer: dict[str, Any] = {}
        self._contact = dict.fromkeys(routes.urls(), time.monotonic())
        self.suspension = ""
        """The syncer's reason while it suspends this learner (empty otherwise)."""
        self.stop_asked = threading.Event()
        """Set when the syncer says the job is finishing: push what is pending, then leave."""

    @property
    def last_contact(self) -> float:
        """When the synchronizer last answered: for a sharded one, the shard heard from least recently."""
        return min(self._contact.values())

    # -- called by the training loop ------------------------------------------------------------
    def start(self, fragments: int) -> dict[str, Any]:
        """Register with every shard (retrying, waiting out a suspension) and start the threads.

        The answer is the first shard's, resuming at the latest step any shard saw from this learner."""
        answers = [self._register(url) for url in self.routes.urls()]
        steps: list[Any] = [a.get("start_step") for a in answers]
        if not all(is_count(step) for step in steps):  # a KeyError, TypeError or OverflowError ended the start
            shown = ", ".join(type(step).__name__ for step in steps)  # not the values: an int's repr may raise
            raise ConfigError(f"the synchronizer answered a start step that is none ({shown}): an integer in [0, 2**62) is")
        self.register_answer = {**answers[0], "start_step": max(steps)}
        self.subscriber.versions = [-1] * fragments
        urls = self.routes.urls()
        streams = self.subscriber.loops(urls)
        loops: list[tuple[str, Callable[[], None]]] = [("heartbeat", functools.partial(self._heartbeat_loop, u)) for u in urls]
        loops += [("upload", self._upload_loop)] * self.slots.most
        for n, (name, target) in enumerate(streams + loops):
            thread = threading.Thread(target=target, name=f"ddctl-{name}-{n}", daemon=True)
            thread.start()
            (self._streams if n < len(streams) else self._threads).append(thread)
        return self.register_answer

    def _register(self, url: str) -> dict[str, Any]:
        client = self.connect(url)
        try:
            while True:
                try:
                    answer = retry(lambda: client.register(self.me.name, self.me.incarnation, self.me.region, self.me.cadence))
                    self._heard(url)  # after a suspension the last refusal may be seconds old
                    self.subscriber.registered(url, answer.get("history"))
                    return answer
                except Refused as exc:
                    if exc.code != "suspended" or self.stopping.is_set():
                        raise
                    self._suspended(url, exc)
                    self.stopping.wait(SUSPENDED_RETRY_S)
        finally:
            client.close()

    def send(self, update: Update) -> None:
        """Queue ``update``; a queued, unsent update of its fragment from the same base absorbs it instead."""
        with self._idle:
            self.ledger.sent += update.c_tokens
            if self.absorb and self._absorbed(update):
                return
            self._busy += 1
        self.outbox.put(update)

    def _absorbed(self, update: Update) -> bool:
        with self.outbox.mutex:  # an uploader takes from the queue under the same lock
            for i, queued in enumerate(self.outbox.queue):
                if (queued.fragment, queued.base_version) == (update.fragment, update.base_version):
                    self.outbox.queue[i] = absorb(queued, update)
                    self.ledger.absorbed += 1
                    return True
        return False

    def arrivals(self) -> list[FragmentVersion]:
        out = []
        while True:
            try:
                out.append(self.inbox.get_nowait())
            except queue.Empty:
                return out

    def came_down(self, nbytes: int) -> None:
        with self._lock:
            self.ledger.bytes_down += nbytes

    def set_report(self, **fields: Any) -> None:
        with self._lock:
            self.report = fields

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued update is acknowledged (or refused); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, reason: str | None = "left", tokens: int | None = None) -> None:
        """Stop the threads; with a ``reason``, say goodbye first (``tokens``: what this life trained in all).

        Without one (the syncer is gone, or started over) the streams are not waited for: each ends at its next frame
        or keep-alive (up to ``keepalive_s``, 5 s), feeding a queue nobody reads, while the next life starts."""
        self.stopping.set()
        for url in self.routes.urls():
            if reason is None:
                break
            client = self.connect(url)
            try:
                retry(functools.partial(client.leave, self.me.name, reason, tokens), give_up_after_s=10.0)
            except (Unavailable, Refused) as exc:
                log.warning("could not say goodbye to %s: %s", url, exc)
            finally:
                client.close()
        for thread in self._threads + (self._streams if reason is not None else []):
            thread.join(timeout=5.0)

    # -- threads --------------------------------------------------------------------------------
    def _heard(self, url: str) -> None:
        self._contact[url] = time.monotonic()

    def _suspended(self, url: str, exc: Refused) -> None:
        """The syncer is there but refuses us until an operator readmits us: not a reason to give up on it."""
        self._heard(url)
        if self.suspension != exc.reason:
            self.suspension = exc.reason
            log.error("suspended by the synchronizer: %s", exc.reason)

    def _reregister(self, client: SyncerClient, url: str) -> None:
        answer = client.register(self.me.name, self.me.incarnation, self.me.region, self.me.cadence)
        self.subscriber.registered(url, answer.get("history"))  # another than before: the shard started over

    def _upload_loop(self) -> None:
        clients: dict[str, SyncerClient] = {}

        def push(frame: bytes, fragment: int) -> dict[str, Any]:
            url = self.routes.url_of(fragment)
            client = clients.get(url) or clients.setdefault(url, self.connect(url))
            return self._timed_push(client, url, frame, fragment)

        try:
            while self.slots.take(self.stopping):
                try:
                    self._upload_next(push)
                finally:
                    self.slots.free()
        finally:
            for client in clients.values():
                client.close()

    def _upload_next(self, push: Callable[[bytes, int], dict[str, Any]]) -> None:
        try:
            update = self.outbox.get(timeout=0.2)
        except queue.Empty:
            return
        taken = time.monotonic()  # the link idles while this thread encodes, too: the pacer counts it in the gap
        try:
            frame = encode_update(update, self.codec, self.block)
            ack = retry(functools.partial(acknowledged, push, frame, update), stop=self.stopping.is_set)
            timing, alone = self._timings.pop(threading.get_ident(), (None, False))
            self.slots.timed(timing, time.monotonic() - taken, alone)
            status = ack["status"]
            with self._lock:
                self.ledger.acked[status] = self.ledger.acked.get(status, 0) + update.c_tokens
                self.ledger.bytes_up += len(frame)
        except Refused as exc:
            log.error("update %s refused: %s", update.update_id, exc)
            with self._lock:
                self.ledger.rejected += update.c_tokens
            if exc.code == IMPOSSIBLE_VERSION:  # its base is a version the syncer never produced: it lost its history
                self.subscriber.lost(f"the synchronizer refused update {update.update_id}: {exc}")
        except Unavailable:
            self.outbox.put(update)  # stopping: leave it queued, drain() reports it unsent
            return
        except Exception:  # a bug or an answer no check foresaw: this thread, and the updates after it, go on
            log.exception("update %s could not be sent: counted as refused", update.update_id)
            with self._lock:
                self.ledger.rejected += update.c_tokens
        with self._idle:
            self._busy -= 1
            self._idle.notify_all()

    def _timed_push(self, client: SyncerClient, url: str, frame: bytes, fragment: int) -> dict[str, Any]:
        """``_push``, with what the kernel says it took: the connection's counters before and after."""
        key, before, started, window, timing, acked = threading.get_ident(), client.sending(), time.monotonic(), None, None, False
        with self._lock:
            self._uplink.begin(key, started)
        try:
            answer = self._push(client, url, frame, fragment)
            after = client.sending()
            if after is not None and (before is None or before.connection != after.connection):
                before = after.at_open()  # the connection was made for this upload (or after a failure)
            window, timing, acked = sent_between(before, after), sent_between(before, after, min_bytes=1), True
            return answer
        finally:
            ended = time.monotonic()
            with self._lock:
                sample = self._uplink.end(key, window, ended)
                alone = self._uplink.last_alone
                if sample is not None:
                    self._up = dict.fromkeys(self.routes.urls(), sample)
            if acked:
                self._timings[key] = (timing, alone)

    def _push(self, client: SyncerClient, url: str, frame: bytes, fragment: int) -> dict[str, Any]:
        based_in = self.subscriber.histories.get(url, "")  # the shard's history as its stream named it, if it has
        try:
            answer = client.push(frame, fragment, based_in)
        except Refused as exc:
            if exc.code == NOT_OWNER:  # ownership moved, or is moving: retried (at the new owner once a map says so)
                try:
                    newer = self.routes.adopt(client.shards())
                except AgentError as bad:  # a map this learner cannot route by (it lacks a shard's address): refused
                    raise Refused(exc.status, exc.code, f"{exc.reason}; {bad}") from None
                raise Unavailable(f"{exc}; {'routing by the newer shard map' if newer else 'a handoff is in flight'}") from None
            if exc.code != "unknown_learner":
                raise
            self._reregister(client, url)
            answer = client.push(frame, fragment, based_in)
        self._heard(url)
        return answer

    def _heartbeat_loop(self, url: str) -> None:
        client = self.connect(url)
        try:
            while not self.stopping.wait(self.interval_s):
                with self._lock:
                    report = dict(self.report)
                    up_bytes, up_seconds = self._up.pop(url, (0, 0.0)) if report else (0, 0.0)
                if not report:
                    continue
                report.update(learner=self.me.name, region=self.me.region, rtt_s=self._rtt)
                report.update(up_bytes=up_bytes, up_seconds=up_seconds, uploads_in_flight=self.slots.cap())
                started = time.perf_counter()
                try:
                    if client.heartbeat(report, self.subscriber.histories.get(url, "")).get("stop") is True:
                        self.stop_asked.set()
                    self.suspension = ""
                    self._rtt = time.perf_counter() - started
                    self._heard(url)
                except Refused as exc:
                    if exc.code == "unknown_learner":
                        try:
                            self._reregister(client, url)
                        except (Refused, Unavailable) as again:
                            if isinstance(again, Refused) and again.code == JOB_OVER:
                                self.stop_asked.set()
                            log.info("re-register failed: %s", again)
                    elif exc.code == "suspended":
                        self._suspended(url, exc)
                    elif exc.code == IMPOSSIBLE_VERSION:  # the shard started over: this life's steps count for nothing
                        self.subscriber.lost(f"the synchronizer at {url} refused a heartbeat: {exc}")
                    else:
                        log.warning("heartbeat refused: %s", exc)
                except Unavailable as exc:
                    log.info("heartbeat: %s", exc)
        finally:
            client.close()
