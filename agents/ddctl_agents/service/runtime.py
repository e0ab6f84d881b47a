"""The synchronizer's imperative shell: one core thread, a real clock, durability.

Every call into the sans-I/O core runs on a single thread, in order, so the core needs no locks and the
write-ahead log sees events in the order the core did. The event loop only moves bytes and waits; decoding and
fsyncs run on their own threads. An acknowledgement or a new fragment version leaves the process only after the
log records that produced it are on disk (group commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ddctl_agents.core.effects import Ack, Effect, Fault, Record, Send
from ddctl_agents.core.ending import departed
from ddctl_agents.core.holds import Holds
from ddctl_agents.core.links import QuorumClock, TransferMeter
from ddctl_agents.core.messages import FragmentVersion, Update, decode_update
from ddctl_agents.core.shardmap import ShardRole
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.core.tape import TapeWriter
from ddctl_agents.core.vclock import CUT
from ddctl_agents.core.version_delta import coder
from ddctl_agents.core.wire import WireLimits
from ddctl_agents.errors import BadRequest, Forbidden, JobOver, UnknownLearner
from ddctl_agents.jsonable import to_json
from ddctl_agents.service import history, link_samples, taping
from ddctl_agents.service.checkpoints import checkpoint_loop, eval_loop, take_checkpoint
from ddctl_agents.service.cuts import Cuts, colour
from ddctl_agents.service.ending import Ending, ending_loop, linger, read_summary
from ddctl_agents.service.link_samples import LinkSample
from ddctl_agents.service.log_records import JoinEntry, LeaveEntry, ReadmitEntry, RejectEntry, UpdateEntry, entry_for
from ddctl_agents.service.publisher import Publisher
from ddctl_agents.service.recovery import recover
from ddctl_agents.service.relay_feeds import RelayFeeds
from ddctl_agents.service.requests import Cadence, HeartbeatBody
from ddctl_agents.service.resume import job_digest, read_local, seed
from ddctl_agents.service.roster import Roster
from ddctl_agents.service.settings import ServiceSettings
from ddctl_agents.service.snapshots import take
from ddctl_agents.service.supervise import supervise
from ddctl_agents.service.wal import Wal
from ddctl_agents.train.assembly import Assembly

T = TypeVar("T")
log = logging.getLogger(__name__)


class SyncerRuntime:
    """Owns the core syncer, its log, tape, publisher and background loops."""

    def __init__(self, assembly: Assembly, settings: ServiceSettings, clock: Callable[[], float] = time.time) -> None:
        self.assembly, self.settings, self.clock = assembly, settings, clock
        self.syncer = assembly.new_syncer(settings.shard)
        self.job_json = to_json(assembly.config)
        self.job_sha = job_digest(assembly.config)
        largest = max(sum(t.numel() for t in frag.values()) for frag in self.syncer.fragments)
        self.max_update_bytes = settings.max_update_bytes or 8 * largest + (1 << 20)
        self.limits = WireLimits(max_payload=self.max_update_bytes, max_tensors=4 * len(assembly.initial) + 16)
        versions = coder(assembly.config.down_codec, assembly.config.sync.block, adopted=False)  # frames only: no one adopts here
        self.publisher = Publisher(assembly.fragmentation.count, versions)
        self.roster = Roster(settings.site)
        self.streams, self.holds = RelayFeeds(), Holds()  # who reads versions here; what a learner at cadence k is sent
        self.meters: dict[str, TransferMeter] = {}
        """Uplink meters, touched only on the event loop's thread."""
        self.val_bpb: list[tuple[float, int, float]] = []
        self.rejections: dict[int, int] = {}
        self.task_failures: dict[str, int] = {}
        self.publish_failures: dict[int, str] = {}
        """Fragments whose newest version could not be encoded for learners, with why."""
        self.snapshots: dict[str, Any] = {"taken": 0, "last_at": None, "last_seconds": None, "bytes": 0}
        self.checkpoints: dict[str, Any] = {"taken": 0, "last_at": None, "rounds": 0, "name": None, "val_bpb": None}
        self.resumed = read_local(settings.resume_from, assembly) if settings.resume_from is not None else None
        self.recovered: dict[str, Any] = {}
        self.ending, self.ended = Ending(), asyncio.Event()
        """``ended`` is set when the service should exit: its job finished and the summary has been there ``linger_s``."""
        self.started_at = clock()
        self.quorum_clock = QuorumClock(self.syncer.config.quorum.quorum, self.started_at)
        self.parameters = sum(t.numel() for t in assembly.initial.values())
        self.flops_per_token = assembly.flops_per_token()
        """The job's model FLOPs per trained token, behind every learner's MFU on the status page."""
        self.tokens_per_learner = assembly.total_steps * assembly.config.inner.batch_size * assembly.model_config.seq_len
        self.bytes_up = self.bytes_down = 0
        self._core = ThreadPoolExecutor(1, "ddctl-core")
        self.io = ThreadPoolExecutor(1, "ddctl-io")
        """Disk writes (fsyncs, snapshots) run here, one at a time, off the event loop and the core."""
        self._work = ThreadPoolExecutor(2, "ddctl-work")
        self._durable, self._commit, self._kick = 0, asyncio.Lock(), asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._logged_faults: dict[int, str] = {}
        self.wal: Wal | None = None
        self.tape: TapeWriter | None = None
        self.cuts = Cuts(settings.state_dir / "cuts", marker=0)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.publisher.history = history.of(self.settings.state_dir)
        await self._on_core(self._recover)
        for p in range(self.assembly.fragmentation.count):
            await self.publish(self.syncer.fragment_message(p))
        summary = read_summary(self.settings.state_dir)
        if summary is not None:  # the job finished in an earlier life: answer status, never train again
            self.ending = Ending(phase="finished", reason=str(summary.get("reason", "")), summary=summary)
            self._tasks = [asyncio.create_task(linger(self), name="linger")]
            return
        loops = {"rounds": self._rounds_loop, "snapshots": self._snapshot_loop, "ending": lambda: ending_loop(self)}
        if self.settings.checkpoints.every_rounds or self.settings.checkpoints.every_s:  # else: only the end's
            loops["checkpoints"] = lambda: checkpoint_loop(self)
        if self.settings.eval_every_s > 0:
            loops["eval"] = lambda: eval_loop(self)
        self._tasks = [asyncio.create_task(supervise(name, loop, self._task_failed), name=name) for name, loop in loops.items()]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.publisher.close()
        await self.snapshot()
        await self._on_core(self._close_files)
        for pool in (self._core, self.io, self._work):
            pool.shutdown(wait=True)

    def _recover(self) -> None:
        now = self.clock()
        self.syncer, self.recovered = recover(
            self._fresh_syncer, self.settings.state_dir, self.job_sha, self._open_tape, self.apply_effects, self.syncer.process
        )
        self.wal = Wal(self.settings.state_dir / "wal")
        for learner, incarnation in self.syncer.live.items():
            self.roster.recovered(now, learner, incarnation)
            self.holds.joined(learner, self.syncer.cadence.get(learner, 1))
        self.cuts.marker = self.syncer.clock.get(CUT, 0)
        resumed = bool(self.recovered["snapshot"] or self.recovered["replayed"] or self.recovered["quarantined"])
        self.roster.event(now, "recovered" if resumed else "started", **self.recovered)

    def _fresh_syncer(self) -> Synchronizer:
        """The job's initial model, or the checkpoint this run resumes from: where every recovery starts."""
        syncer = self.assembly.new_syncer(self.settings.shard)
        if self.resumed is not None:
            seed(syncer, self.resumed)
        return syncer

    def _open_tape(self, tape_bytes: int) -> None:
        self.tape = TapeWriter.resume(self.settings.state_dir / "tape.jsonl", tape_bytes, taping.header(self))

    def _close_files(self) -> None:
        if self.wal is not None:
            self.wal.close()
        if self.tape is not None:
            self.tape.close()

    # -- requests (event loop) ------------------------------------------------------------------
    async def register(self, learner: str, incarnation: int, region: str, cadence: Cadence = 1) -> dict[str, Any]:
        start_step, position = await self._on_core(self._register, learner, incarnation, region, cadence)
        await self.commit_to(position)
        self._kick.set()
        return {
            "learner": learner,
            "incarnation": incarnation,
            "start_step": start_step,
            "history": self.publisher.history,  # which its versions count in: a relay's list must agree before it is believed
            "versions": self.publisher.versions(),
            "clock": dict(self.syncer.clock),
        }

    async def leave(self, learner: str, reason: str, tokens: int | None = None) -> None:
        if tokens is not None and learner in self.roster.info:  # at most one learner's share: a claim, not a fact
            self.roster.info[learner].tokens = min(tokens, self.tokens_per_learner)
        position = await self._on_core(self._leave, learner, reason, True)
        await self.commit_to(position)
        self._kick.set()

    async def heartbeat(self, report: HeartbeatBody) -> dict[str, Any]:
        """Progress in; the versions out, and ``stop`` once the job is finishing (the learner pushes and leaves)."""
        await self._on_core(self._heartbeat, report)
        return {"versions": self.publisher.versions(), "stop": self.ending.phase != "training"}

    async def push(self, identity: str, body: bytes, fragment: int | None = None) -> tuple[Update, Ack]:
        """Decode (off the loop), check identity and ``fragment`` (its header's), hand to the core, wait for durability:
        a rejection too is answered once durable, so the count that may suspend its sender survives a crash."""
        loop = asyncio.get_running_loop()
        update, _ = await loop.run_in_executor(self._work, lambda: decode_update(body, self.limits, measure=True))
        if update.learner != identity:
            raise Forbidden(f"token is for {identity!r} but the update claims learner {update.learner!r}")
        if fragment is not None and update.fragment != fragment:
            raise BadRequest(f"header x-ddctl-fragment says {fragment}, the update is of fragment {update.fragment}")
        ack, position = await self._on_core(self._receive, update, body)
        await self.commit_to(position)
        self._kick.set()
        versions = self.publisher.versions()  # a rejected update's fragment may be none of the job's
        if ack.status != "rejected" and self.holds.pushed(update.learner, update.fragment, ack, versions[update.fragment]):
            await self.publisher.nudge()
        return update, ack

    async def readmit(self, learner: str) -> bool:
        """The operator lets a suspended learner back in; False if it was not suspended."""
        readmitted, position = await self._on_core(self._readmit, learner)
        await self.commit_to(position)
        return readmitted

    def observe_link(
        self, learner: str, direction: str, nbytes: int, seconds: float, kernel: bool = False, *, rate: bool = True,
        site: bool = True, ended_ago: float = 0.0,
    ) -> None:  # fmt: skip
        """A throughput sample of a learner's "up" or "down" link from the HTTP layer (``kernel``: TCP_INFO-timed), for
        its ``rate`` estimates and the ``site``'s meter (where it ended ``ended_ago`` seconds ago)."""
        sample = LinkSample(learner, direction, nbytes, seconds, kernel, self.clock() - ended_ago)
        self._core.submit(link_samples.observe, self, sample, rate=rate, site=site)

    def inflight(self, learner: str, fragment: int, received: int, expected: int | None) -> None:
        """Progress of an upload, from the HTTP layer (runs on the core thread via the loop)."""
        self._core.submit(self.syncer.observe_inflight, self.clock(), learner, fragment, received, expected)

    async def snapshot(self) -> dict[str, Any]:
        """A durable snapshot now (``snapshots.take``): rounds go on while it is written."""
        return await take(self)

    async def checkpoint(self, val_bpb: float | None = None) -> dict[str, Any]:
        """A checkpoint of the global model now (``checkpoints.take_checkpoint``); rounds go on."""
        return await take_checkpoint(self, val_bpb)

    async def view(self, render: Callable[[SyncerRuntime], T]) -> T:
        """A read-only view (status, metrics, clock) computed on the core thread: one consistent moment."""
        return await self._on_core(render, self)

    @property
    def role(self) -> ShardRole | None:
        """This shard's place now (handoffs move its map); None: one synchronizer owning every fragment."""
        return getattr(self.syncer, "role", None)

    def degraded(self) -> dict[int, str]:
        """Fragments in trouble, with why: a round that failed, or a version learners could not be sent."""
        return {**self.syncer.degraded, **self.publish_failures}

    # -- core thread ----------------------------------------------------------------------------
    def _register(self, learner: str, incarnation: int, region: str, cadence: Cadence) -> tuple[int, int]:
        assert self.wal is not None
        if self.ending.phase != "training":
            raise JobOver(f"the job is {self.ending.phase} ({self.ending.reason}); no learner joins any more")
        self.roster.check_region(region)
        now = self.clock()
        links = self.syncer.links.get(learner)
        start_step = links.pace.last_step if links is not None else 0
        self.apply_effects(self.syncer.register(now, learner, incarnation, start_step, cadence))
        self.roster.joined(now, learner, incarnation, region, start_step, self.syncer.links[learner])
        self.holds.joined(learner, cadence)
        joined = JoinEntry(t=now, learner=learner, incarnation=incarnation, start_step=start_step, cadence=cadence)
        position = self.wal.append(joined.model_dump())
        self.quorum_clock.update(now, len(self.syncer.live))
        return start_step, position

    def _leave(self, learner: str, reason: str, voluntary: bool = False) -> int:
        assert self.wal is not None
        now = self.clock()
        effects = self.syncer.deregister(now, learner, reason)
        if effects:
            self.apply_effects(effects)
            self.wal.append(LeaveEntry(t=now, learner=learner, reason=reason).model_dump())
            self.roster.event(now, "leave", learner=learner, reason=reason)
            self.roster.set_state(learner, departed(reason) if voluntary else "gone")
        self.quorum_clock.update(now, len(self.syncer.live))
        return self.wal.appended

    def _heartbeat(self, report: HeartbeatBody) -> None:
        learner = report.learner
        self.syncer.check_sender(learner)
        if learner not in self.syncer.live:
            raise UnknownLearner(f"learner {learner!r} is not registered (declared gone or never joined); register again")
        if report.due and len(report.due) != self.syncer.fragmentation.count:
            raise BadRequest(
                f"field 'due' must list one step per fragment ({self.syncer.fragmentation.count}), got {len(report.due)}"
            )
        now = self.clock()
        self.syncer.heartbeat(now, learner, report.step, report.step_time, tuple(report.due))
        links, regional = self.roster.heard(now, report, self.syncer.links[learner])
        for up in (links.up, regional.up):  # as the learner's kernel timed it; LinkEstimate drops what cannot tell
            up.observe(report.up_bytes, report.up_seconds, report.rtt_s, kernel=True)

    def _receive(self, update: Update, body: bytes) -> tuple[Ack, int]:
        assert self.wal is not None
        now = self.clock()
        colour(self, update)  # a global checkpoint's colour: this shard cuts before an update from past its cut
        ack, effects = self.syncer.receive(now, update, len(body))
        if ack.status == "rejected":
            self.wal.append(RejectEntry(t=now, learner=update.learner, reason=ack.reason).model_dump())
            self.roster.event(now, "rejected", learner=update.learner, fragment=update.fragment, code=ack.code, reason=ack.reason)
            log.warning("update %s of %s rejected (%s): %s", update.update_id, update.learner, ack.code, ack.reason)
        elif ack.status != "duplicate":
            self.wal.append(UpdateEntry(t=now, nbytes=len(body)).model_dump(), body)
            self.roster.learner(update.learner).last_seen = now
            self.bytes_up += len(body)
        self.apply_effects(effects)
        counts = self.roster.learner(update.learner).updates
        counts[ack.status] = counts.get(ack.status, 0) + 1
        return ack, self.wal.appended

    def _readmit(self, learner: str) -> tuple[bool, int]:
        assert self.wal is not None
        now = self.clock()
        effects = self.syncer.readmit(now, learner)
        if effects:
            self.apply_effects(effects)
            self.wal.append(ReadmitEntry(t=now, learner=learner).model_dump())
            self.roster.event(now, "readmitted", learner=learner)
            self.roster.set_state(learner, "gone")
        return bool(effects), self.wal.appended

    def _poll(self) -> tuple[list[FragmentVersion], int, float | None]:
        assert self.wal is not None
        now = self.clock()
        for learner in sorted(self.syncer.live):
            info = self.roster.info.get(learner)
            if info is not None and now - info.last_seen > self.settings.heartbeat_timeout_s:
                self._leave(learner, f"no heartbeat for {now - info.last_seen:.1f}s")
        effects = self.syncer.poll(now)
        for effect in effects:
            logged = entry_for(now, effect.entry) if isinstance(effect, Record) else None
            if logged is not None:
                self.wal.append(logged.model_dump())
        self.apply_effects(effects)
        sends = [e.message for e in effects if isinstance(e, Send) and e.reason == "round"]
        return sends, self.wal.appended, self.syncer.next_wake()

    def apply_effects(self, effects: list[Effect]) -> None:
        """Tape every record and show it on the page; log each new fault with its traceback."""
        now = self.clock()
        for effect in effects:
            if isinstance(effect, Fault):
                self._fault(now, effect)
            elif isinstance(effect, Record):
                if self.tape is not None:
                    self.tape.write(effect.entry)
                self.roster.note(now, effect.entry)

    def _fault(self, now: float, fault: Fault) -> None:
        if self._logged_faults.get(fault.fragment) != fault.reason:
            self._logged_faults[fault.fragment] = fault.reason
            log.error("%s", fault.reason, exc_info=fault.error)
            self.roster.event(now, "fragment-degraded", fragment=fault.fragment, reason=fault.reason)

    def _task_failed(self, name: str, exc: BaseException) -> None:
        self.task_failures[name] = self.task_failures.get(name, 0) + 1
        log.error("task %s failed (%d times so far); restarting it", name, self.task_failures[name], exc_info=exc)
        self.roster.event(self.clock(), "task-failed", task=name, reason=f"{type(exc).__name__}: {exc}")

    async def _rounds_loop(self) -> None:
        while True:
            sends, position, wake = await self._on_core(self._poll)
            if sends:
                await self.commit_to(position)
                for message in sends:
                    await self.publish(message)
            delay = 0.5 if wake is None else min(max(wake - self.clock(), 0.0), 0.5)
            self._kick.clear()
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel landing with the kick (stop() hung)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._kick.wait()

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.snapshot_every_s)
            await self.snapshot()

    # -- helpers --------------------------------------------------------------------------------
    async def _on_core(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._core, fn, *args)

    async def commit_to(self, position: int) -> None:
        """Return once log records up to ``position`` are durable; one fsync serves every waiter."""
        if position <= self._durable or self.wal is None:
            return
        async with self._commit:
            if position > self._durable:
                self._durable = await asyncio.get_running_loop().run_in_executor(self.io, self.wal.sync)

    async def publish(self, message: FragmentVersion) -> None:
        """Encode and publish one version (a shard publishes only its own); a failure marks its fragment degraded."""
        if (role := self.role) is not None and message.fragment not in role.owned:
            return
        loop = asyncio.get_running_loop()
        try:
            item = await loop.run_in_executor(self._work, self.publisher.code, message)
        except Exception as exc:  # noqa: BLE001 - one fragment that cannot be sent must not stop the others
            reason = f"version {message.version} of fragment {message.fragment} cannot be sent: {type(exc).__name__}: {exc}"
            self.publish_failures[message.fragment] = reason
            log.error("%s", reason, exc_info=exc)
            self.roster.event(self.clock(), "fragment-degraded", fragment=message.fragment, reason=reason)
            return
        self.publish_failures.pop(message.fragment, None)
        await self.publisher.publish(item)
