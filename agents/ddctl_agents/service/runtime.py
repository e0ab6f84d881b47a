"""The synchronizer's imperative shell: one core thread, a real clock, durability.

Every call into the sans-I/O core runs on a single thread, in order, so the core
needs no locks and the write-ahead log sees events in the order the core did.
The event loop only moves bytes and waits; decoding and fsyncs run on their own
threads. An acknowledgement or a new fragment version leaves the process only
after the log records that produced it are on disk (group commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ddctl_agents.core.links import LearnerLinks, QuorumClock, TransferMeter
from ddctl_agents.core.messages import FragmentVersion, Update, decode_update, encode_fragment
from ddctl_agents.core.syncer import Ack, Effect, Record, Send
from ddctl_agents.core.syncer_state import capture
from ddctl_agents.core.tape import TAPE_FORMAT, TapeWriter
from ddctl_agents.core.wire import WireLimits
from ddctl_agents.errors import UnknownLearner
from ddctl_agents.jsonable import to_json
from ddctl_agents.service.auth import Forbidden
from ddctl_agents.service.publisher import Published, Publisher
from ddctl_agents.service.recovery import SNAPSHOT, recover
from ddctl_agents.service.wal import Wal
from ddctl_agents.train.assembly import Assembly

T = TypeVar("T")
_ROUND_FIELDS = ("t", "fragment", "version", "cause", "reason", "grace_s", "admitted")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceSettings:
    state_dir: Path
    run: str = "run"
    max_update_bytes: int = 0
    """413 above this; 0 means twice the fp32 size of the largest fragment plus 1 MiB."""
    heartbeat_timeout_s: float = 20.0
    """A learner silent this long is declared gone and stops counting toward quorum."""
    snapshot_every_s: float = 30.0
    eval_every_s: float = 0.0
    """Evaluate the global model's val_bpb this often (0: never)."""
    keepalive_s: float = 5.0


@dataclass(slots=True)
class LearnerInfo:
    """What the status page shows about one learner, beside the core's link estimates."""

    region: str = ""
    incarnation: int = 0
    state: str = "training"
    step: int = 0
    tokens: int = 0
    tokens_per_s: float = 0.0
    loss: float | None = None
    staleness: int = 0
    last_seen: float = 0.0
    joined_at: float = 0.0
    updates: dict[str, int] = field(default_factory=dict)


class SyncerRuntime:
    """Owns the core syncer, its log, tape, publisher and background loops."""

    def __init__(self, assembly: Assembly, settings: ServiceSettings, clock: Callable[[], float] = time.time) -> None:
        self.assembly, self.settings, self.clock = assembly, settings, clock
        self.syncer = assembly.new_syncer()
        self.job_json = to_json(assembly.config)
        self.job_sha = hashlib.sha256(json.dumps(self.job_json, sort_keys=True).encode()).hexdigest()
        largest = max(sum(t.numel() for t in frag.values()) for frag in self.syncer.fragments)
        self.max_update_bytes = settings.max_update_bytes or 8 * largest + (1 << 20)
        self.limits = WireLimits(max_payload=self.max_update_bytes, max_tensors=4 * len(assembly.initial) + 16)
        self.publisher = Publisher(assembly.fragmentation.count)
        self.info: dict[str, LearnerInfo] = {}
        self.meters: dict[str, TransferMeter] = {}
        """Uplink meters, touched only on the event loop's thread."""
        self.regions: dict[str, LearnerLinks] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=64)
        self.recent_rounds: deque[dict[str, Any]] = deque(maxlen=32)
        self.val_bpb: list[tuple[float, int, float]] = []
        self.rejections: dict[int, int] = {}
        self.snapshots: dict[str, Any] = {"taken": 0, "last_at": None, "last_seconds": None, "bytes": 0}
        self.recovered: dict[str, Any] = {}
        self.started_at = clock()
        self.quorum_clock = QuorumClock(self.syncer.config.quorum.quorum, self.started_at)
        self.parameters = sum(t.numel() for t in assembly.initial.values())
        self.bytes_up = 0
        self.bytes_down = 0
        self._core = ThreadPoolExecutor(1, "ddctl-core")
        self._io = ThreadPoolExecutor(1, "ddctl-io")
        self._work = ThreadPoolExecutor(2, "ddctl-work")
        self._durable = 0
        self._commit = asyncio.Lock()
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.wal: Wal | None = None
        self.tape: TapeWriter | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        await self._on_core(self._recover)
        for p in range(self.assembly.fragmentation.count):
            await self._publish(self.syncer.fragment_message(p))
        self._tasks = [
            asyncio.create_task(self._rounds_loop(), name="rounds"),
            asyncio.create_task(self._snapshot_loop(), name="snapshots"),
        ]
        if self.settings.eval_every_s > 0:
            self._tasks.append(asyncio.create_task(self._eval_loop(), name="eval"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.publisher.close()
        await self.snapshot()
        await self._on_core(self._close_files)
        for pool in (self._core, self._io, self._work):
            pool.shutdown(wait=True)

    def _recover(self) -> None:
        now = self.clock()
        self.recovered = recover(self.syncer, self.settings.state_dir, self.job_sha, self._open_tape, self._apply_effects)
        self.wal = Wal(self.settings.state_dir / "wal")
        for learner, incarnation in self.syncer.live.items():
            self.info[learner] = LearnerInfo(incarnation=incarnation, last_seen=now, joined_at=now, state="recovered")
        self._event(now, "recovered", **self.recovered)

    def _open_tape(self, tape_bytes: int) -> None:
        path = self.settings.state_dir / "tape.jsonl"
        if path.exists():
            with path.open("r+b") as f:
                f.truncate(tape_bytes)
        self.tape = TapeWriter(path)
        if tape_bytes == 0:
            self.tape.write({"type": "config", "format": TAPE_FORMAT, "service": True, "config": self.job_json})

    def _close_files(self) -> None:
        if self.wal is not None:
            self.wal.close()
        if self.tape is not None:
            self.tape.close()

    # -- requests (event loop) ------------------------------------------------------------------
    async def register(self, learner: str, incarnation: int, region: str) -> dict[str, Any]:
        start_step, position = await self._on_core(self._register, learner, incarnation, region)
        await self._commit_to(position)
        self._kick.set()
        return {
            "learner": learner,
            "incarnation": incarnation,
            "start_step": start_step,
            "versions": self.publisher.versions(),
            "clock": dict(self.syncer.clock),
        }

    async def leave(self, learner: str, reason: str) -> None:
        position = await self._on_core(self._leave, learner, reason)
        await self._commit_to(position)
        self._kick.set()

    async def heartbeat(self, learner: str, report: dict[str, Any]) -> dict[str, Any]:
        await self._on_core(self._heartbeat, learner, report)
        return {"versions": self.publisher.versions()}

    async def push(self, identity: str, body: bytes) -> tuple[Update, Ack]:
        """Decode (off the loop), check identity, hand to the core, wait for durability."""
        loop = asyncio.get_running_loop()
        update, _ = await loop.run_in_executor(self._work, decode_update, body, self.limits)
        if update.learner != identity:
            raise Forbidden(f"token is for {identity!r} but the update claims learner {update.learner!r}")
        ack, position = await self._on_core(self._receive, update, body)
        await self._commit_to(position)
        self._kick.set()
        return update, ack

    def observe_upload(self, learner: str, nbytes: int, seconds: float) -> None:
        """A throughput sample of a learner's uplink from the HTTP layer's meter."""
        self._core.submit(self._observe_upload, learner, nbytes, seconds)

    def inflight(self, learner: str, fragment: int, received: int, expected: int | None) -> None:
        """Progress of an upload, from the HTTP layer (runs on the core thread via the loop)."""
        self._core.submit(self.syncer.observe_inflight, self.clock(), learner, fragment, received, expected)

    async def snapshot(self) -> dict[str, Any]:
        """Capture on the core thread (no tensor copies), write on the I/O thread; rounds go on."""
        if self.wal is None:
            return {}
        started = time.perf_counter()
        state, segment = await self._on_core(self._capture)
        loop = asyncio.get_running_loop()
        nbytes = await loop.run_in_executor(self._io, self._write_snapshot, state.to_bytes, segment)
        seconds = time.perf_counter() - started
        self.snapshots.update(
            taken=int(self.snapshots["taken"] or 0) + 1, last_at=self.clock(), last_seconds=seconds, bytes=nbytes
        )
        self._event(self.clock(), "snapshot", bytes=nbytes, seconds=round(seconds, 4), wal_segment=segment)
        return {"bytes": nbytes, "seconds": seconds, "wal_segment": segment}

    async def view(self, render: Callable[[SyncerRuntime], T]) -> T:
        """A read-only view (status, metrics, clock) computed on the core thread: one consistent moment."""
        return await self._on_core(render, self)

    # -- core thread ----------------------------------------------------------------------------
    def _register(self, learner: str, incarnation: int, region: str) -> tuple[int, int]:
        assert self.wal is not None
        now = self.clock()
        links = self.syncer.links.get(learner)
        start_step = links.pace.last_step if links is not None else 0
        self._apply_effects(self.syncer.register(now, learner, incarnation, start_step))
        links = self.syncer.links[learner]
        regional = self.regions.get(region)
        if regional is not None and links.up.bytes_per_s is None:
            links.up.bytes_per_s, links.up.rtt_s = regional.up.bytes_per_s, regional.up.rtt_s
        info = self.info.setdefault(learner, LearnerInfo())
        info.region, info.incarnation, info.state, info.last_seen, info.joined_at = region, incarnation, "training", now, now
        info.step = max(info.step, start_step)
        position = self.wal.append(
            {"kind": "join", "t": now, "learner": learner, "incarnation": incarnation, "start_step": start_step}
        )
        self._event(now, "join", learner=learner, region=region, incarnation=incarnation, start_step=start_step)
        self.quorum_clock.update(now, len(self.syncer.live))
        return start_step, position

    def _leave(self, learner: str, reason: str) -> int:
        assert self.wal is not None
        now = self.clock()
        effects = self.syncer.deregister(now, learner, reason)
        if effects:
            self._apply_effects(effects)
            self.wal.append({"kind": "leave", "t": now, "learner": learner, "reason": reason})
            self._event(now, "leave", learner=learner, reason=reason)
        if learner in self.info:
            self.info[learner].state = "left" if reason == "left" else "gone"
        self.quorum_clock.update(now, len(self.syncer.live))
        return self.wal.appended

    def _heartbeat(self, learner: str, report: dict[str, Any]) -> None:
        if learner not in self.syncer.live:
            raise UnknownLearner(f"learner {learner!r} is not registered (declared gone or never joined); register again")
        now = self.clock()
        self.syncer.heartbeat(now, learner, report["step"], report["step_time"], tuple(report["due"]))
        info = self.info.setdefault(learner, LearnerInfo())
        info.step, info.tokens, info.tokens_per_s = report["step"], report["tokens"], report["tokens_per_s"]
        info.loss, info.staleness, info.last_seen, info.state = report["loss"], report["staleness"], now, "training"
        links, regional = self.syncer.links[learner], self.regions.setdefault(info.region, LearnerLinks())
        if report["down_bytes"] > 0 and report["down_seconds"] > 0:
            self.syncer.observe_download(learner, report["down_bytes"], report["down_seconds"])
            regional.down.observe(report["down_bytes"], report["down_seconds"])
        if report["rtt_s"] is not None:
            links.up.observe(0, 0.0, report["rtt_s"])
            regional.up.observe(0, 0.0, report["rtt_s"])

    def _observe_upload(self, learner: str, nbytes: int, seconds: float) -> None:
        self.syncer.observe_upload(learner, nbytes, seconds)
        region = self.info[learner].region if learner in self.info else ""
        self.regions.setdefault(region, LearnerLinks()).up.observe(nbytes, seconds)

    def _receive(self, update: Update, body: bytes) -> tuple[Ack, int]:
        assert self.wal is not None
        now = self.clock()
        ack, effects = self.syncer.receive(now, update, len(body))
        if ack.status != "duplicate":
            self.wal.append({"kind": "update", "t": now, "nbytes": len(body)}, body)
            self.info.setdefault(update.learner, LearnerInfo()).last_seen = now
            self.bytes_up += len(body)
        self._apply_effects(effects)
        counts = self.info.setdefault(update.learner, LearnerInfo()).updates
        counts[ack.status] = counts.get(ack.status, 0) + 1
        return ack, self.wal.appended

    def _poll(self) -> tuple[list[FragmentVersion], int, float | None]:
        assert self.wal is not None
        now = self.clock()
        for learner in sorted(self.syncer.live):
            info = self.info.get(learner)
            if info is not None and now - info.last_seen > self.settings.heartbeat_timeout_s:
                self._leave(learner, f"no heartbeat for {now - info.last_seen:.1f}s")
        effects = self.syncer.poll(now)
        for effect in effects:
            if isinstance(effect, Record) and effect.entry["type"] == "round":
                e = effect.entry
                self.wal.append(
                    {
                        "kind": "close",
                        "t": now,
                        "fragment": e["fragment"],
                        "cause": e["cause"],
                        "reason": e["reason"],
                        "grace_s": e["grace_s"],
                    }
                )
                self.recent_rounds.append(
                    {k: e[k] for k in ("t", "fragment", "version", "cause", "reason", "grace_s", "admitted")}
                )
        self._apply_effects(effects)
        sends = [e.message for e in effects if isinstance(e, Send) and e.reason == "round"]
        return sends, self.wal.appended, self.syncer.next_wake()

    def _capture(self) -> tuple[Any, int]:
        assert self.wal is not None and self.tape is not None
        segment = self.wal.rotate()
        tape_bytes = self.tape.path.stat().st_size
        state = capture(
            self.syncer, {"wal_segment": segment, "tape_bytes": tape_bytes, "job_sha": self.job_sha, "t": self.clock()}
        )
        return state, segment

    def _write_snapshot(self, to_bytes: Callable[[], bytes], segment: int) -> int:
        assert self.wal is not None
        data = to_bytes()
        final = self.settings.state_dir / SNAPSHOT
        tmp = final.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        dir_fd = os.open(self.settings.state_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self.wal.drop_before(segment)
        return len(data)

    def _apply_effects(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Record) and self.tape is not None:
                self.tape.write(effect.entry)

    def _event(self, now: float, kind: str, **fields: Any) -> None:
        self.events.append({"t": round(now, 3), "event": kind, **fields})

    # -- loops ----------------------------------------------------------------------------------
    async def _rounds_loop(self) -> None:
        while True:
            sends, position, wake = await self._on_core(self._poll)
            if sends:
                await self._commit_to(position)
                for message in sends:
                    await self._publish(message)
            delay = 0.5 if wake is None else min(max(wake - self.clock(), 0.0), 0.5)
            self._kick.clear()
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that lands as the
            # kick arrives, and stop() then waited forever for this loop (1 run in ~20 of the recovery test)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._kick.wait()

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.snapshot_every_s)
            await self.snapshot()

    async def _eval_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.eval_every_s)
            params, rounds = await self._on_core(lambda: (dict(self.syncer.global_params()), self.syncer.rounds_closed))
            bpb = await loop.run_in_executor(self._io, self.assembly.evaluate, params)
            self.val_bpb.append((round(self.clock(), 3), rounds, round(bpb, 5)))

    # -- helpers --------------------------------------------------------------------------------
    async def _on_core(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._core, fn, *args)

    async def _commit_to(self, position: int) -> None:
        """Return once log records up to ``position`` are durable; one fsync serves every waiter."""
        if position <= self._durable or self.wal is None:
            return
        async with self._commit:
            if position > self._durable:
                self._durable = await asyncio.get_running_loop().run_in_executor(self._io, self.wal.sync)

    async def _publish(self, message: FragmentVersion) -> None:
        loop = asyncio.get_running_loop()
        frame = await loop.run_in_executor(
            self._work, encode_fragment, message, self.assembly.config.down_codec, self.assembly.config.sync.block
        )
        await self.publisher.publish(Published(fragment=message.fragment, version=message.version, frame=frame))
