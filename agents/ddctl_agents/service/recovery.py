"""Rebuild the syncer after a crash: last snapshot, then the write-ahead log after it.

The core is deterministic in its event sequence, and the log holds every event
that changed it (joins, leaves, updates with their payloads, round closes with
their recorded time and cause), so replaying the log reproduces the state the
crashed process had acknowledged, and the event tape it had written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddctl_agents.core.messages import decode_update
from ddctl_agents.core.syncer import Effect, Synchronizer
from ddctl_agents.core.syncer_state import STATE_LIMITS, load, restore
from ddctl_agents.errors import ConfigError
from ddctl_agents.service.wal import WalRecord, read_segment, segment_path, segments

SNAPSHOT = "snapshot.ddlw"


def apply_record(syncer: Synchronizer, record: WalRecord) -> list[Effect]:
    """Re-run one logged event through the core."""
    m, t = record.meta, float(record.meta["t"])
    kind = m["kind"]
    if kind == "join":
        return syncer.register(t, m["learner"], m["incarnation"], m["start_step"])
    if kind == "leave":
        return syncer.deregister(t, m["learner"], m["reason"])
    if kind == "update":
        update, _ = decode_update(record.payload, STATE_LIMITS)
        return syncer.receive(t, update, m["nbytes"])[1]
    if kind == "close":
        return syncer.close_round(t, m["fragment"], m["cause"], m["reason"], m["grace_s"])
    raise ConfigError(f"write-ahead log record of unknown kind {kind!r}")


def recover(
    syncer: Synchronizer,
    state_dir: Path,
    job_sha: str,
    open_tape: Callable[[int], None],
    on_effects: Callable[[list[Effect]], None],
) -> dict[str, Any]:
    """Bring a freshly built syncer to the last durable state; returns what was recovered.

    ``open_tape`` gets the tape length the snapshot accounts for (the tape is cut
    there and the replay re-appends the rest); ``on_effects`` gets each replayed
    event's effects.
    """
    snapshot = state_dir / SNAPSHOT
    meta: dict[str, Any] = {"wal_segment": 0, "tape_bytes": 0, "snapshot": False}
    if snapshot.exists():
        state = load(snapshot.read_bytes())
        if state.meta.get("job_sha") != job_sha:
            raise ConfigError(f"{state_dir} holds the state of another job; use a fresh --state-dir or the original job")
        restore(syncer, state)
        meta = {**state.meta, "snapshot": True}
    open_tape(meta["tape_bytes"])
    replayed = 0
    wal_dir = state_dir / "wal"
    for number in segments(wal_dir) if wal_dir.exists() else []:
        if number < meta["wal_segment"]:
            continue
        for record in read_segment(segment_path(wal_dir, number)):
            on_effects(apply_record(syncer, record))
            replayed += 1
    return {
        "snapshot": meta["snapshot"],
        "wal_segment": meta["wal_segment"],
        "tape_bytes": meta["tape_bytes"],
        "replayed": replayed,
    }
