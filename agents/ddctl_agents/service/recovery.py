"""Rebuild the syncer after a crash: the newest readable snapshot, then the write-ahead log after it.

The core is deterministic in its event sequence, and the log holds every event
that changed it (joins, leaves, updates with their payloads, rejections, round
closes with their recorded time and cause), so replaying the log reproduces the
state the crashed process had acknowledged, and the event tape it had written.

Recovery never bricks the job: every record is validated as the live path
validates it, and one that cannot be applied is set aside, with its reason, in
``quarantine.wal`` (same record format, readable with ``wal.read_segment``);
the syncer comes up with everything else. An unreadable snapshot is moved into
``quarantine/`` and the previous one is used, with the longer log after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ddctl_agents.core import vclock
from ddctl_agents.core.effects import Effect
from ddctl_agents.core.messages import decode_update
from ddctl_agents.core.shard_syncer import ShardSynchronizer
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.core.syncer_state import STATE_LIMITS, load, restore
from ddctl_agents.errors import AgentError, ConfigError, Unreplayable
from ddctl_agents.service.log_records import (
    ENTRY,
    CloseEntry,
    CutEntry,
    DiscardEntry,
    HandoffInEntry,
    HandoffOutEntry,
    JoinEntry,
    LeaveEntry,
    ReadmitEntry,
    RejectEntry,
    UpdateEntry,
)
from ddctl_agents.service.snapshots import snapshots
from ddctl_agents.service.wal import WalRecord, append_record, read_segment, segment_path, segments

QUARANTINE = "quarantine.wal"
log = logging.getLogger(__name__)


def apply_record(syncer: Synchronizer, record: WalRecord) -> list[Effect]:
    """Re-run one logged event through the core, after validating it as the live path would."""
    try:
        entry = ENTRY.validate_python(record.meta)
    except ValidationError as exc:
        raise Unreplayable(f"malformed record: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}") from None
    match entry:
        case JoinEntry():
            return syncer.register(entry.t, entry.learner, entry.incarnation, entry.start_step, entry.cadence)
        case LeaveEntry():
            return syncer.deregister(entry.t, entry.learner, entry.reason)
        case UpdateEntry():
            update, _ = decode_update(record.payload, STATE_LIMITS)
            ack, effects = syncer.receive(entry.t, update, entry.nbytes)
            if ack.status == "rejected":
                raise Unreplayable(f"update {update.update_id} of {update.learner} is refused: {ack.reason}", effects)
            return effects
        case RejectEntry():
            return syncer.reject(entry.t, entry.learner, entry.reason)
        case CloseEntry():
            if not 0 <= entry.fragment < syncer.fragmentation.count:
                raise Unreplayable(f"fragment {entry.fragment} does not exist in this job")
            return syncer.close_round(entry.t, entry.fragment, entry.cause, entry.reason, entry.grace_s)
        case DiscardEntry():
            if not 0 <= entry.fragment < syncer.fragmentation.count:
                raise Unreplayable(f"fragment {entry.fragment} does not exist in this job")
            return syncer.discard_round(entry.t, entry.fragment, entry.reason)
        case CutEntry():
            return syncer.cut(entry.t, entry.epoch, entry.trigger)
        case HandoffOutEntry() | HandoffInEntry():
            if not isinstance(syncer, ShardSynchronizer):
                raise Unreplayable("a fragment handoff in the log of a synchronizer that is not sharded")
            if isinstance(entry, HandoffOutEntry):
                return syncer.hand_out(entry.t, entry.fragment, entry.to, entry.epoch)
            return syncer.hand_in(entry.t, bytes(record.payload))
        case ReadmitEntry():
            return syncer.readmit(entry.t, entry.learner)
    raise Unreplayable(f"record of unknown kind {record.meta.get('kind')!r}")  # unreachable: the union is closed


def recover(
    new_syncer: Callable[[], Synchronizer],
    state_dir: Path,
    job_sha: str,
    open_tape: Callable[[int], None],
    on_effects: Callable[[list[Effect]], None],
    process: str = vclock.SYNCER,
) -> tuple[Synchronizer, dict[str, Any]]:
    """A syncer at the last durable state, and what was recovered.

    ``open_tape`` gets the tape length the snapshot accounts for (the tape is cut
    there and the replay re-appends the rest); ``on_effects`` gets each replayed
    event's effects. ``process`` is who the state belongs to (a shard's name).
    """
    claim(state_dir, process)
    syncer, meta, set_aside = _from_snapshot(new_syncer, state_dir, job_sha)
    open_tape(meta["tape_bytes"])
    replayed, quarantined = 0, 0
    wal_dir = state_dir / "wal"
    for number in segments(wal_dir) if wal_dir.exists() else []:
        if number < meta["wal_segment"]:
            continue
        for index, record in enumerate(read_segment(segment_path(wal_dir, number))):
            try:
                on_effects(apply_record(syncer, record))
                replayed += 1
            except Exception as exc:  # noqa: BLE001 - any record that cannot be applied is set aside, never fatal
                on_effects(exc.effects if isinstance(exc, Unreplayable) else [])
                reason = f"{type(exc).__name__}: {exc}"
                append_record(
                    state_dir / QUARANTINE, {**record.meta, "set_aside": reason, "at": f"{number}:{index}"}, record.payload
                )
                quarantined += 1
    if quarantined or set_aside:
        log.error(
            "recovery set aside %d log records and %d snapshots (quarantine.wal, quarantine/ in %s)",
            quarantined,
            len(set_aside),
            state_dir,
        )
    return syncer, {
        "snapshot": meta["snapshot"],
        "wal_segment": meta["wal_segment"],
        "tape_bytes": meta["tape_bytes"],
        "replayed": replayed,
        "quarantined": quarantined,
        "snapshots_set_aside": set_aside,
    }


def claim(state_dir: Path, process: str) -> None:
    """A state directory holds one synchronizer process's state for life: shard S1 must never recover S0's fragments."""
    path = state_dir / "process"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(process + "\n")
        tmp.replace(path)
        return
    held = path.read_text(errors="replace").strip()
    if held != process:
        raise ConfigError(f"{state_dir} holds the state of {held!r:.40}, not {process!r}; give each shard its own --state-dir")


def _from_snapshot(
    new_syncer: Callable[[], Synchronizer], state_dir: Path, job_sha: str
) -> tuple[Synchronizer, dict[str, Any], list[str]]:
    """The newest snapshot that loads (unreadable ones moved to quarantine/), or a fresh syncer."""
    set_aside: list[str] = []
    for segment, path in snapshots(state_dir):
        try:
            state = load(path.read_bytes())
        except (AgentError, OSError) as exc:
            set_aside.append(f"{path.name}: {exc}")
            _move_aside(state_dir, path)
            continue
        if state.meta.get("job_sha") != job_sha:
            raise ConfigError(f"{state_dir} holds the state of another job; use a fresh --state-dir or the original job")
        syncer = new_syncer()
        try:
            restore(syncer, state)
        except (AgentError, KeyError, TypeError, ValueError) as exc:
            set_aside.append(f"{path.name}: {type(exc).__name__}: {exc}")
            _move_aside(state_dir, path)
            continue
        return syncer, {**state.meta, "snapshot": True, "wal_segment": max(segment, int(state.meta["wal_segment"]))}, set_aside
    if set_aside and 0 not in segments(state_dir / "wal"):
        raise ConfigError(
            f"{state_dir}: no snapshot could be read ({'; '.join(set_aside)}) and the log no longer starts at the "
            "beginning, so the state cannot be rebuilt; they are in quarantine/. Move the directory aside to start over."
        )
    return new_syncer(), {"wal_segment": 0, "tape_bytes": 0, "snapshot": False}, set_aside


def _move_aside(state_dir: Path, path: Path) -> None:
    target = state_dir / "quarantine"
    target.mkdir(exist_ok=True)
    path.rename(target / f"{int(time.time())}-{path.name}")
