"""A job's end on the synchronizer: learners stop, the last rounds close, the result is written, the service leaves.

The job ends when every learner has trained its share of the budget
(``core/ending.py``) or when the operator asks (``POST /v1/admin/stop``, which
``ddctl stop`` sends). While it *finishes*, heartbeats answer ``stop`` so live
learners push their last drift and leave, and the rounds loop merges what
arrived. Once nothing is left (or ``finish_timeout_s`` passed), the service
evaluates the final model, ends its tape with the parameters' hash (what
``ddctl replay`` must reproduce), takes a last snapshot and writes ``summary.json``
beside it: the result and where it lies. It keeps answering status requests
for ``linger_s`` so that the controller and ``ddctl status`` read the summary,
then exits. A syncer started on a state directory that holds a summary is
finished from the start: a finished job never trains again by accident.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddctl_agents.core.ending import budget_trained, drained
from ddctl_agents.service.roster import counted
from ddctl_agents.service.taping import end_record
from ddctl_agents.train.checksum import params_sha256

if TYPE_CHECKING:
    from ddctl_agents.service.runtime import SyncerRuntime

log = logging.getLogger(__name__)
SUMMARY = "summary.json"
BUDGET_REASON = "every learner trained its share of the token budget"


@dataclass(slots=True)
class Ending:
    """Where the job is in its life: ``training``, ``finishing`` (since, why) or ``finished`` (with its summary)."""

    phase: str = "training"
    reason: str = ""
    since: float | None = None
    summary: dict[str, Any] | None = None

    def begin(self, now: float, reason: str) -> bool:
        """Start finishing; False if the job was already finishing or finished (the first reason stands)."""
        if self.phase != "training":
            return False
        self.phase, self.reason, self.since = "finishing", reason, now
        return True

    def view(self) -> dict[str, Any]:
        return {"phase": self.phase, "reason": self.reason, "since": self.since, "summary": self.summary}


def summary_path(state_dir: Path) -> Path:
    return state_dir / SUMMARY


def read_summary(state_dir: Path) -> dict[str, Any] | None:
    """The summary a finished job left, or None (an unreadable one counts as none, and is logged)."""
    path = summary_path(state_dir)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.error("%s is unreadable (%s); the job is treated as unfinished", path, exc)
        return None
    return data if isinstance(data, dict) else None


def write_summary(state_dir: Path, summary: dict[str, Any]) -> None:
    """Durably, all or nothing: tmp file, fsync, rename."""
    path = summary_path(state_dir)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(json.dumps(summary, indent=2, sort_keys=True))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def tokens(rt: SyncerRuntime) -> dict[str, int]:
    """The token books in tokens (the ledger counts fragment-tokens): each figure is one thing, named for it.

    ``trained`` is what learners report having trained, summed over their lives,
    and never less than ``received`` (every received token was trained; reports
    from lives before a syncer restart are not kept)."""
    s = rt.syncer
    p = s.fragmentation.count
    books = {name: value // p for name, value in s.ledger.as_dict().items()}
    reported = sum(info.tokens_before + info.tokens for info in rt.roster.info.values())
    budget = rt.assembly.config.budget
    planned = rt.tokens_per_learner * budget.learners
    return {"budget": budget.tokens, "planned": planned, "trained": max(reported, books["received"]), **books}


def goodput(learners: list[dict[str, Any]], uptime_s: object) -> float | None:
    """Share of learner time spent training: the seconds each learner's loop trained while this process heard it
    (``train_s``), over learners x uptime. Where no learner has said (agents too old to), steps x the median step
    time estimate it, as before: that read 0.645-1.0 (clipped) for twelve runs of the example whose learners' own
    seconds said 0.925-0.950. A figure that is not a finite number >= 0 counts as unsaid (the dashboard draws a
    status from another process with this)."""
    uptime = _figure(uptime_s)
    if not learners or not uptime:
        return None
    said = [_figure(e.get("train_s")) for e in learners]
    if any(seconds is not None for seconds in said):
        trained = sum(seconds or 0.0 for seconds in said)
    else:
        times = [t for e in learners if (t := _figure(e.get("step_time_s")))]
        if not times:
            return None
        trained = sum(_figure(e.get("step")) or 0.0 for e in learners) * statistics.median(times)
    return round(min(trained / (len(learners) * uptime), 1.0), 4)


def _figure(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _due(rt: SyncerRuntime) -> bool:
    """On the core thread: begin finishing when the budget is trained; True once a finishing job may close."""
    s, now = rt.syncer, rt.clock()
    if budget_trained(s.finished, rt.assembly.config.budget.learners, s.live, s.ledger.pending):
        _begin(rt, BUDGET_REASON)
    if rt.ending.phase != "finishing" or rt.ending.since is None:
        return False
    if drained(s.live, s.ledger.pending):
        return True
    if now - rt.ending.since > rt.settings.finish_timeout_s:
        log.warning("finishing: %d learners still live after %.0fs; closing without them", len(s.live), now - rt.ending.since)
        return True
    return False


def _begin(rt: SyncerRuntime, reason: str) -> bool:
    """On the core thread: start finishing (once; the first reason stands), and say so."""
    now = rt.clock()
    started = rt.ending.begin(now, reason)
    if started:
        rt.roster.event(now, "finishing", reason=reason)
        log.info("finishing: %s", reason)
    return started


async def stop_job(rt: SyncerRuntime, reason: str) -> dict[str, Any]:
    """The operator ends the job early: learners are told to stop, then it finishes as if its budget were done."""
    started = await rt.view(lambda r: _begin(r, reason))
    return {"stopping": started, **rt.ending.view()}


async def ending_loop(rt: SyncerRuntime) -> None:
    """Watch for the end; when it comes, write the result and let the service leave."""
    while not await rt.view(_due):
        await asyncio.sleep(0.25)
    await finish(rt)


async def finish(rt: SyncerRuntime) -> None:
    """Evaluate the final model, snapshot, write the summary, record ``finished``; exit after ``linger_s``."""
    loop = asyncio.get_running_loop()
    val_bpb, checkpoint = None, None
    if rt.role is None:  # a shard holds part of the model: it can neither evaluate nor checkpoint it alone
        params = await rt.view(lambda r: dict(r.syncer.global_params()))
        exact = await loop.run_in_executor(None, rt.assembly.evaluate, params)
        checkpoint = (await rt.checkpoint(exact))["path"]  # the final model, as ``ddctl pull`` fetches it
        val_bpb = round(exact, 5)
    await _tape_end(rt, val_bpb)
    snapshot = await rt.snapshot()
    summary = await rt.view(lambda r: _summary(r, val_bpb, snapshot) | {"checkpoint": checkpoint})
    await loop.run_in_executor(None, write_summary, rt.settings.state_dir, summary)
    await rt.view(lambda r: _finished(r, summary))
    log.info("finished: %s; result in %s", summary["reason"], summary_path(rt.settings.state_dir))
    await linger(rt)


async def linger(rt: SyncerRuntime) -> None:
    await asyncio.sleep(rt.settings.linger_s)
    rt.ended.set()


async def _tape_end(rt: SyncerRuntime, val_bpb: float | None) -> None:
    """The tape's last record, what ``ddctl replay`` must reproduce (``service/taping.py``): its fields taken on the
    core thread, the hash (seconds for a large model) off it, so status requests are answered meanwhile."""
    record, params = await rt.view(lambda r: end_record(r, val_bpb))
    record["params_sha256"] = await asyncio.get_running_loop().run_in_executor(None, params_sha256, params)
    await rt.view(lambda r: r.tape.write(record) if r.tape is not None else None)


def _finished(rt: SyncerRuntime, summary: dict[str, Any]) -> None:
    rt.ending.phase, rt.ending.summary = "finished", summary
    rt.roster.event(rt.clock(), "finished", reason=summary["reason"], val_bpb=summary["val_bpb"])


def _summary(rt: SyncerRuntime, val_bpb: float | None, snapshot: dict[str, Any]) -> dict[str, Any]:
    s, now = rt.syncer, rt.clock()
    learners = [{"id": name, "step": info.step, "step_time_s": s.links[name].pace.step_time if name in s.links else None,
                 "train_s": counted(info)} for name, info in sorted(rt.roster.info.items())]  # fmt: skip
    uptime = now - rt.started_at
    return {
        "run": rt.settings.run,
        "reason": rt.ending.reason,
        "finished_at": round(now, 3),
        "uptime_s": round(uptime, 3),
        "quorum_s": round(rt.quorum_clock.seconds(now), 3),
        "goodput": goodput(learners, uptime),
        "rounds": s.rounds_closed,
        "versions": list(s.versions),
        "tokens": tokens(rt),
        "val_bpb": val_bpb,
        "bytes_up": rt.bytes_up,
        "bytes_down": rt.bytes_down,
        "learners_finished": sorted(s.finished),
        "snapshot_bytes": snapshot.get("bytes"),
        "state_dir": str(rt.settings.state_dir),
        "shard": None if rt.role is None else rt.role.name,
    }
