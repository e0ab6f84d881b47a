"""Runs as first-class objects: which run a command means, the list of runs, and removing what ended runs left.

Every command acts on one run. ``--run NAME`` names it; without it the only
live run is meant, and when there is none or several, the error lists them
(no command guesses between two runs). A run is live while it may hold
machines: starting, training, or finished with ``--keep``.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddctl import providers
from ddctl.control.rundir import RunDir, data_dir
from ddctl.control.state import RunRecord, State
from ddctl.errors import DdctlError

LIVE = ("starting", "training", "kept")
"""States in which a run may hold machines (``kept``: finished, its machines kept with ``up --keep``)."""
ENDED = ("down", "finished")


class NoSuchRun(DdctlError):
    """``--run`` names a run this machine has no record of, or none was named and the choice is not obvious."""


def describe(records: list[RunRecord]) -> str:
    return "; ".join(f"{r.id} ({r.state})" for r in records) or "none"


def choose_run(state: State, run: str = "") -> str:
    """``run`` if this machine knows it, else the only live run; otherwise an error that lists the runs."""
    records = state.runs()
    if run:
        if not run.isprintable() or not run.isascii() or state.run(run) is None:  # run names are ASCII (regions.py)
            raise NoSuchRun(f"no run named {run!r}; runs: {describe(records)} (`ddctl ls` lists them)")
        return run
    live = [r for r in records if r.state in LIVE]
    if len(live) == 1:
        return live[0].id
    if not live:
        hint = f"; pick an ended one with --run NAME (runs: {describe(records)})" if records else ""
        raise NoSuchRun(f"no run is live; start one with: ddctl up --dry-run{hint}")
    raise NoSuchRun(f"{len(live)} runs are live: {describe(live)}; pick one with --run NAME")


@dataclass(frozen=True, slots=True)
class RunRow:
    """One line of ``ddctl ls``."""

    run: str
    state: str
    regions: list[str]
    instances_up: int
    created: float
    age_s: float
    dollars_per_hour: float | None
    """What it costs now: its plan's rate while it holds machines (it runs, or ended with them kept), 0 once ended."""
    dollars_so_far: float | None
    result: str


def dollars_so_far(record: RunRecord, now: float) -> float | None:
    """The run's price per hour (from its plan) times the hours it has held machines; None when a region is unpriced.

    It holds them until ``down`` removes them (``released_at``; the end of a job removes them too), or, where no
    removal was recorded, until its job ended; a run that keeps its machines after its end holds them still."""
    rate = record.detail.get("dollars_per_hour")
    if rate is None:
        return None
    ended_at = record.detail.get("ended_at") if record.state != "kept" else None
    ended = float(record.detail.get("released_at") or ended_at or now)
    return round(float(rate) * max(ended - record.created, 0.0) / 3600, 4)


def instances_up(run: str, kinds: set[str]) -> int:
    """How many machines of ``run`` the providers' labels say are running (providers that cannot answer count none)."""
    usable = [providers.get(k) for k in sorted(kinds) if providers.unavailable(k) is None]
    return sum(1 for provider in usable for i in provider.list_run(run) if i.alive)


def list_runs(state: State, now: float | None = None) -> list[RunRow]:
    """Every run this machine knows, with how many of its machines the providers' labels say are up."""
    now = time.time() if now is None else now
    rows = []
    for record in state.runs():
        kinds = set((record.detail.get("kinds") or {}).values())
        regions = sorted((record.detail.get("kinds") or {}).keys())
        up = 0 if record.state == "down" else instances_up(record.id, kinds)
        summary = record.detail.get("summary") or {}
        rows.append(
            RunRow(
                run=record.id,
                state=record.state,
                regions=regions,
                instances_up=up,
                created=record.created,
                age_s=round(now - record.created, 1),
                dollars_per_hour=0.0 if record.state in ENDED else record.detail.get("dollars_per_hour"),
                dollars_so_far=dollars_so_far(record, now),
                result=str(summary.get("result") or summary.get("state_dir", "")),  # where it is on this machine
            )
        )
    return rows


def purge(state: State) -> dict[str, Any]:
    """Remove the local directories (keys, secrets, logs, final snapshots) of ended runs, and their records.

    Live runs are never touched. Directories of runs this machine no longer has a
    record of (set aside by a fresh ``up`` under the same name) go too."""
    root = data_dir() / "runs"
    ended = [r for r in state.runs() if r.state in ENDED]
    live = {r.id for r in state.runs() if r.state not in ENDED}
    removed: list[dict[str, Any]] = []
    for record in ended:
        removed.append(_remove(RunDir(record.id).root, record.id))
        state.delete_run(record.id)
    for path in sorted(root.iterdir()) if root.exists() else []:
        if path.is_dir() and path.name not in live:  # e.g. "example.20261130T180000": an older life of a name
            removed.append(_remove(path, path.name))
    return {"removed": removed, "bytes": sum(item["bytes"] for item in removed)}


def _remove(path: Path, run: str) -> dict[str, Any]:
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0
    shutil.rmtree(path, ignore_errors=True)
    return {"run": run, "path": str(path), "bytes": size}
