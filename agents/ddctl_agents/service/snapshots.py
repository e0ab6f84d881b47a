"""Snapshot files on the syncer's disk: the newest two are kept, each named for its log segment.

``snapshot-<segment>.ddlw`` holds the state at the start of WAL segment
``<segment>``. Keeping the previous snapshot (and the log segments after it)
means one unreadable snapshot costs a longer replay, not the job.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

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
