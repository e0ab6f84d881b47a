"""M learners and the real syncer core in one process, on a virtual clock.

Training compute is real (torch), messages are really encoded and decoded
through the wire format, but time is simulated: each learner's step takes
``step_time_s / speed`` virtual seconds (with seeded jitter) and each transfer
``latency + bytes / bandwidth`` on a per-learner link that carries one message
at a time. Events run in (time, sequence) order, so a run is deterministic for
its config and its tape replays bit for bit. With ``cluster.shards`` > 1 the
synchronizer is that many shards (``local/shards.py``), each writing its own tape.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddctl.config.train import TrainConfig
from ddctl.local.shards import Shards
from ddctl_agents.core.effects import Effect, Fault, Record, Send
from ddctl_agents.core.holds import Holds
from ddctl_agents.core.messages import FragmentVersion, Update, decode_update, encode_update
from ddctl_agents.core.tape import TapeWriter
from ddctl_agents.core.version_delta import coder
from ddctl_agents.errors import ConfigError
from ddctl_agents.train.assembly import Assembly, learner_index, learner_name
from ddctl_agents.train.learner import Learner, LearnerLedger

Progress = Callable[[int, int], None]
"""Called with (tokens trained so far, token budget)."""


def heartbeat_bytes(name: str, step: int, due: tuple[int, ...]) -> int:
    """What a heartbeat would weigh as JSON on the wire; counted in bytes_up."""
    return len(json.dumps({"learner": name, "step": step, "step_time": 1.234567, "tokens": 123456789, "due": list(due)}))


LOSS_EVERY = 10


@dataclass(frozen=True, slots=True)
class Upload:
    """One upload as its sender timed it: it left the link at ``ends`` after ``busy_s`` seconds on it."""

    ends: float
    nbytes: int
    busy_s: float
    shard: int
    """The shard it went to (which timed it itself on arrival)."""


@dataclass(slots=True)
class _Slot:
    """One learner position; a replacement after a failure is a new incarnation."""

    index: int
    speed: float
    rng: random.Random
    learner: Learner | None = None
    incarnation: int = -1
    alive: bool = False
    died_at: dict[int, float] = field(default_factory=dict)
    up_free_at: float = 0.0
    down_free_at: float = 0.0
    step_started: float = 0.0
    inbox: list[tuple[float, int, FragmentVersion]] = field(default_factory=list)
    uploads: list[Upload] = field(default_factory=list)
    """Uploads whose timing no heartbeat has reported yet, oldest first."""
    sent_down: dict[int, int] = field(default_factory=dict)
    """Fragment -> the version of it last sent down to this incarnation."""

    @property
    def name(self) -> str:
        return learner_name(self.index)


@dataclass(slots=True)
class ClusterStats:
    bytes_up: int = 0
    bytes_down: int = 0
    tokens: int = 0
    lost_in_flight: int = 0
    lost_at_failure: int = 0
    learner_ledger: LearnerLedger = field(default_factory=LearnerLedger)
    loss_curve: list[list[float]] = field(default_factory=list)
    causes: dict[str, int] = field(default_factory=dict)
    """Rounds closed per cause code (core.quorum.CAUSES)."""
    admitted: list[int] = field(default_factory=list)
    """Learners admitted fresh (not late) by each round, in order."""
    round_times: list[tuple[float, int]] = field(default_factory=list)
    """(virtual time, fragment) of each round close."""
    virtual_time_s: float = 0.0


class VirtualCluster:
    """Runs a TrainConfig's Decoupled DiLoCo job to its token budget."""

    def __init__(self, assembly: Assembly, tapes: Sequence[TapeWriter] = (), progress: Progress | None = None) -> None:
        """``tapes``: none, or one per shard."""
        if not isinstance(assembly.config, TrainConfig):
            raise ConfigError("the virtual cluster needs a TrainConfig: a job plus its cluster")
        self.cfg: TrainConfig = assembly.config
        self.a, self.tapes, self.progress = assembly, tuple(tapes), progress
        self.shards = Shards(assembly, self.cfg.cluster.shards)
        if self.tapes and len(self.tapes) != len(self.shards.cores):
            raise ConfigError(f"give one tape per shard ({len(self.shards.cores)}), got {len(self.tapes)}")
        self.holds = Holds()
        self.versions = coder(self.cfg.down_codec, self.cfg.sync.block)
        self.stats = ClusterStats()
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.bytes_per_s = self.cfg.cluster.link_mbps * 1e6 / 8
        self.latency = self.cfg.cluster.latency_ms / 1000
        self.slots = [
            _Slot(index=i, speed=s, rng=random.Random(f"{self.cfg.inner.seed}:{i}")) for i, s in enumerate(self.cfg.speeds())
        ]
        self.draining = False
        self.now = 0.0

    # -- event loop ---------------------------------------------------------------------------
    def run(self) -> ClusterStats:
        for slot in self.slots:
            self._push(0.0, "join", (slot.index, 0))
        for outage in self.cfg.cluster.outages:
            self._push(outage.at, "fail", (outage.learner, outage.duration))
        while self.events:
            self.now, _, kind, data = heapq.heappop(self.events)
            getattr(self, f"_on_{kind}")(*data)
        self._finish()
        self.stats.virtual_time_s = self.now
        return self.stats

    def _push(self, at: float, kind: str, data: tuple[Any, ...]) -> None:
        heapq.heappush(self.events, (at, next(self.seq), kind, data))

    def _on_join(self, index: int, start_step: int) -> None:
        slot = self.slots[index]
        if self.draining or slot.alive:
            return
        slot.incarnation += 1
        slot.alive, slot.inbox, slot.sent_down = True, [], {}
        cadence = self.cfg.cadences()[index]
        slot.learner = self.a.new_learner(index, slot.incarnation, start_step, cadence=cadence)
        self.holds.joined(slot.name, cadence)
        for shard, core in enumerate(self.shards.cores):
            self._apply(core.register(self.now, slot.name, slot.incarnation, start_step, cadence), shard)
        ready_at = max((t for t, _, _ in slot.inbox), default=self.now)
        self._start_step(slot, slot.incarnation, at=ready_at)

    def _on_step(self, index: int, incarnation: int) -> None:
        slot = self.slots[index]
        if not slot.alive or slot.incarnation != incarnation or self.draining:
            return
        learner = slot.learner
        assert learner is not None
        if not learner.ready:
            self._adopt_arrived(slot)
        loss = learner.train_step()
        self.stats.tokens += learner.tokens_per_step
        if learner.step % LOSS_EVERY == 0:
            self.stats.loss_curve.append([self.stats.tokens, round(float(loss), 5)])
        due = learner.due_steps()
        beat = (slot.name, learner.step, self.now - slot.step_started, due, self._latest_upload(slot))
        self._push(self.now + self.latency, "heartbeat", beat)
        self.stats.bytes_up += heartbeat_bytes(slot.name, learner.step, due)
        for p in learner.due():
            if learner.has_drift(p):
                self._send(slot, learner.make_update(p))
        self._adopt_arrived(slot)
        if self.progress:
            self.progress(self.stats.tokens, self.cfg.budget.tokens)
        if self.stats.tokens >= self.cfg.budget.tokens:
            self._drain()
        else:
            self._start_step(slot, incarnation)

    def _on_heartbeat(self, name: str, step: int, step_time: float, due: tuple[int, ...], upload: Upload | None) -> None:
        """Every shard hears the learner's progress; the shards its latest upload did not go to also hear how that
        upload went (an agent's heartbeat carries its kernel-timed uplink sample to every shard, ``agent/comm.py``),
        so a shard forecasts a learner's arrival before that learner has sent it anything."""
        for shard, core in enumerate(self.shards.cores):
            core.heartbeat(self.now, name, step, step_time, due)
            if upload is not None and shard != upload.shard:
                core.observe_link(name, "up", upload.nbytes, upload.busy_s, rtt_s=2 * self.latency)

    def _on_arrive(self, index: int, incarnation: int, frame: bytes, busy_s: float) -> None:
        slot = self.slots[index]
        died = slot.died_at.get(incarnation)
        update, _ = decode_update(frame)
        if died is not None and died < self.now:
            self.stats.lost_in_flight += update.c_tokens  # the sender died mid-upload: nothing of it lands
            return
        core = self.shards.owner(update.fragment)
        if update.learner not in core.live:
            self.stats.lost_in_flight += update.c_tokens
            return
        core.observe_link(update.learner, "up", len(frame), busy_s, rtt_s=2 * self.latency)
        ack, effects = core.receive(self.now, update, len(frame))
        self.holds.pushed(update.learner, update.fragment, ack)
        self._apply(effects, self.shards.owners[update.fragment])
        self._poll()

    def _on_wake(self) -> None:
        self._poll()

    def _on_fail(self, index: int, duration: float | None) -> None:
        slot = self.slots[index]
        if not slot.alive or self.draining:
            return
        assert slot.learner is not None
        slot.alive = False
        slot.died_at[slot.incarnation] = self.now
        self.stats.lost_at_failure += slot.learner.unsent()
        self._retire(slot)
        self._write({"type": "failure", "t": self.now, "learner": slot.name, "incarnation": slot.incarnation})
        self._push(
            self.now + self.cfg.cluster.detect_after_steps * self.cfg.cluster.step_time_s, "detect", (index, slot.incarnation)
        )
        if duration is not None:
            self._push(self.now + duration, "rejoin", (index,))

    def _on_detect(self, index: int, incarnation: int) -> None:
        slot = self.slots[index]
        if slot.incarnation == incarnation and not slot.alive:
            for shard, core in enumerate(self.shards.cores):
                self._apply(core.deregister(self.now, slot.name, "heartbeat timeout"), shard)
            self._poll()

    def _on_rejoin(self, index: int) -> None:
        self._on_join(index, self.shards.last_step(self.slots[index].name))

    # -- helpers ------------------------------------------------------------------------------
    def _send(self, slot: _Slot, update: Update) -> None:
        frame = encode_update(update, self.cfg.sync.codec, self.cfg.sync.block)
        self.stats.bytes_up += len(frame)
        busy_s = len(frame) / self.bytes_per_s  # what a sender's kernel times: bytes on the wire, no latency, no queue
        slot.up_free_at = max(self.now, slot.up_free_at) + busy_s
        owner = self.shards.owners[update.fragment]
        slot.uploads.append(Upload(ends=slot.up_free_at, nbytes=len(frame), busy_s=busy_s, shard=owner))
        self._push(slot.up_free_at + self.latency, "arrive", (slot.index, slot.incarnation, frame, busy_s))

    def _apply(self, effects: list[Effect], shard: int) -> None:
        """Carry out what shard ``shard``'s core asked for: its records go on its own tape."""
        for effect in effects:
            if isinstance(effect, Record):
                self._count_round(effect.entry)
                if self.tapes:
                    self.tapes[shard].write(effect.entry)
            elif isinstance(effect, Send):
                self._deliver(effect, shard)
            elif isinstance(effect, Fault):  # a bug in the core: a local run has no operator to page, so fail loudly
                raise effect.error

    def _deliver(self, send: Send, shard: int) -> None:
        coded = self.versions.code(send.message)
        for name in send.to:
            slot = self.slots[learner_index(name)]
            if not slot.alive or not self._wanted(slot, send):
                continue
            holds = slot.sent_down.get(send.message.fragment, -1)  # a delta where it holds the last one
            frame, message = coded.sent(holds, rounded=self.holds.held(slot.name))
            slot.sent_down[send.message.fragment] = coded.message.version
            busy_s = len(frame) / self.bytes_per_s
            slot.down_free_at = max(self.now, slot.down_free_at) + busy_s
            slot.inbox.append((slot.down_free_at + self.latency, next(self.seq), message))
            self.shards.cores[shard].observe_link(name, "down", len(frame), busy_s, rtt_s=2 * self.latency)
            self.stats.bytes_down += len(frame)

    def _wanted(self, slot: _Slot, send: Send) -> bool:
        """Whether a learner at cadence k > 1 is sent this version (``core/holds.py``); at cadence 1 always."""
        assert slot.learner is not None
        p, version = send.message.fragment, send.message.version
        seen = -1 if send.reason == "bootstrap" else slot.learner.state[p].version
        if not self.holds.wants(slot.name, p, version, seen):
            return False
        self.holds.sent(slot.name, p)
        return True

    def _latest_upload(self, slot: _Slot) -> Upload | None:
        """The latest upload off the learner's link since its last heartbeat (samples are not summed: the agent's)."""
        done = [u for u in slot.uploads if u.ends <= self.now]
        slot.uploads = [u for u in slot.uploads if u.ends > self.now]
        return done[-1] if done else None

    def _adopt_arrived(self, slot: _Slot) -> None:
        assert slot.learner is not None
        arrived = sorted(m for m in slot.inbox if m[0] <= self.now)
        slot.inbox = [m for m in slot.inbox if m[0] > self.now]
        for _, _, message in arrived:
            update = slot.learner.on_arrival(message)
            if update is not None:
                self._send(slot, update)

    def _poll(self) -> None:
        if self.draining:  # every live learner is flushing: its rounds wait for all of it (closed in _finish)
            return
        for shard, core in enumerate(self.shards.cores):
            self._apply(core.poll(self.now), shard)
        wake = self.shards.next_wake()
        if wake is not None and not any(kind == "wake" and t == wake for t, _, kind, _ in self.events):
            self._push(wake, "wake", ())

    def _drain(self) -> None:
        """Budget reached: every live learner flushes its drift; rounds close once all of it lands.

        No round closes on the normal schedule meanwhile: judged by it, the first learner's flush
        closed most rounds alone, and the others' drift then took a second, out-of-date outer step."""
        self.draining = True
        for slot in self.slots:
            if slot.alive and slot.learner is not None and slot.learner.ready:
                for p in range(self.a.fragmentation.count):
                    if slot.learner.has_drift(p):
                        self._send(slot, slot.learner.make_update(p))

    def _finish(self) -> None:
        for shard, core in enumerate(self.shards.cores):
            for p in core.open_rounds():
                effects = core.close_round(self.now, p, "final_drain", "final drain: every live learner flushed its drift")
                self._apply(effects, shard)
        for slot in self.slots:
            if slot.alive:
                self._retire(slot)

    def _retire(self, slot: _Slot) -> None:
        assert slot.learner is not None
        total, ledger = self.stats.learner_ledger, slot.learner.ledger
        total.trained += ledger.trained
        total.sent += ledger.sent
        total.overwritten += ledger.overwritten

    def _count_round(self, entry: dict[str, Any]) -> None:
        if entry.get("type") == "round":
            cause = str(entry["cause"])
            self.stats.causes[cause] = self.stats.causes.get(cause, 0) + 1
            self.stats.admitted.append(sum(not a["late"] for a in entry["admitted"]))
            self.stats.round_times.append((self.now, entry["fragment"]))

    def _write(self, record: dict[str, Any]) -> None:
        """A record of the cluster itself (a failure), not of a shard's: on every shard's tape."""
        for tape in self.tapes:
            tape.write(record)

    def _step_time(self, slot: _Slot) -> float:
        jitter = 1.0 + self.cfg.cluster.jitter * slot.rng.gauss(0.0, 1.0)
        return self.cfg.cluster.step_time_s / slot.speed * min(max(jitter, 0.5), 1.5)

    def _start_step(self, slot: _Slot, incarnation: int, at: float | None = None) -> None:
        """Schedule the slot's next step; the heartbeat after it reports how long it took."""
        slot.step_started = self.now if at is None else at
        self._push(slot.step_started + self._step_time(slot), "step", (slot.index, incarnation))
