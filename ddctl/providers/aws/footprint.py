"""Where a run went: the cloud regions it made something in, remembered in its run directory.

EC2 is regional: there is no call that lists a run's instances everywhere.
Every region the provider prepares (the file's, and failover regions on first
use) is written down, so ``list_run``, ``down`` and the controller look in all
of them, and only in them. So are the instances already retired: EC2 lists a
terminated instance for an hour, and until it is retired (its last words read,
its log collected) the controller must see it as ended, not as absent.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ddctl.control.rundir import RunDir


def _file(run: str) -> Path:
    return RunDir(run).root / "aws-regions"


def regions(run: str) -> list[str]:
    """The cloud regions this run has made something in."""
    path = _file(run)
    return [line for line in path.read_text().split() if line] if path.exists() else []


def remember(run: str, region: str) -> None:
    known = regions(run)
    if region not in known:
        path = _file(run)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join([*known, region]) + "\n")


def forget(run: str) -> None:
    for path in (_file(run), _retired_file(run)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _retired_file(run: str) -> Path:
    return RunDir(run).root / "aws-retired"


def retired(run: str) -> set[str]:
    """The instances whose end has been dealt with (log collected, terminated)."""
    path = _retired_file(run)
    return set(path.read_text().split()) if path.exists() else set()


def mark_retired(run: str, instance_id: str) -> None:
    path = _retired_file(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(instance_id + "\n")
