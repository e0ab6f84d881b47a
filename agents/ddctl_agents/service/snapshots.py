"""Snapshots: taking one while rounds go on, and their files on the syncer's disk (the newest two are kept).

``snapshot-<segment>.ddlw`` holds the state at the start of WAL segment
``<segment>``. Keeping the previous snapshot (and the log segments after it)
means one unreadable snapshot costs a longer replay, not the job.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddctl_agents.core.syncer_state import SyncerState, capture

if TYPE_CHECKING:
    from ddctl_agents.service.runtime import SyncerRuntime

KEEP = 2
_NAME = re.compile(r"snapshot-(\d{8})\.ddlw")
LEGACY = "snapshot.ddlw"
"""The single snapshot file of state directories written before two were kept."""


def snapshot_path(state_dir: Path, segment: int) -> Path:
    return state_dir / f"snapshot-{segment:08d}.ddlw"


def snapshots(state_dir: Path) -> list[tuple[int, Path]]:
    """(segment, path) of every snapshot, newest first; a legacy file counts as the oldest."""
    found = sorted(
        ((int(m.group(1)), p) for p in state_dir.glob("snapshot-*.ddlw") if (m := _NAME.fullmatch(p.name))), reverse=True
    )
    legacy = state_dir / LEGACY
    return found + ([(-1, legacy)] if legacy.exists() else [])


def write_snapshot(state_dir: Path, segment: int, data: bytes) -> int:
    """Write durably (tmp, fsync, rename, fsync dir), keep the newest ``KEEP``; returns the oldest kept segment."""
    final = snapshot_path(state_dir, segment)
    tmp = final.with_suffix(".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    kept = snapshots(state_dir)
    for _, old in kept[KEEP:]:
        old.unlink(missing_ok=True)
    _fsync_dir(state_dir)
    return max(kept[min(KEEP, len(kept)) - 1][0], 0)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def take(rt: SyncerRuntime) -> dict[str, Any]:
    """Capture on the core thread (no tensor copies), write on the I/O thread; rounds go on."""
    if rt.wal is None:
        return {}
    started = time.perf_counter()
    state, segment = await rt.view(_capture)
    nbytes = await asyncio.get_running_loop().run_in_executor(rt.io, _write, rt, state, segment)
    seconds = time.perf_counter() - started
    rt.snapshots.update(taken=int(rt.snapshots["taken"] or 0) + 1, last_at=rt.clock(), last_seconds=seconds, bytes=nbytes)
    rt.roster.event(rt.clock(), "snapshot", bytes=nbytes, seconds=round(seconds, 4), wal_segment=segment)
    return {"bytes": nbytes, "seconds": seconds, "wal_segment": segment}


def _capture(rt: SyncerRuntime) -> tuple[SyncerState, int]:
    assert rt.wal is not None and rt.tape is not None
    segment = rt.wal.rotate()
    tape_bytes = rt.tape.path.stat().st_size
    meta = {"wal_segment": segment, "tape_bytes": tape_bytes, "job_sha": rt.job_sha, "t": rt.clock()}
    return capture(rt.syncer, meta), segment


def _write(rt: SyncerRuntime, state: SyncerState, segment: int) -> int:
    assert rt.wal is not None
    data = state.to_bytes()
    rt.wal.drop_before(write_snapshot(rt.settings.state_dir, segment, data))
    return len(data)
