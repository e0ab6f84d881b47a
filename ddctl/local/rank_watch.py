"""Which data-parallel ranks have gone silent, in which phase, and what they were doing.

A gloo rendezvous or collective that never completes waits out its timeout (600 s) before
it fails, so a stuck rank used to look like a slow run: a clean-clone CI once spent its whole
600-s test limit inside a data-parallel run that never reported, with nothing to say where.
Each rank now tells the parent its phase, and beats every few seconds while it trains; a
rank silent for ``stall_s`` in a phase that waits on its peers is named with that phase and
its stack (``faulthandler``, on SIGUSR1), then killed. A stall in the rendezvous, before any step
has trained, loses nothing, so the run may start again; one in training does not.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ddctl.errors import WorkerError

PHASES = ("starting", "joining", "training", "evaluating")
"""A rank's phases in order: spawned and loading its data, in the gloo rendezvous, stepping, rank 0's evaluation."""

BEFORE_TRAINING = frozenset({"starting", "joining"})
"""Phases in which no step has been taken: a run stalled there is started again at no cost."""

WAITING = frozenset({"joining", "training"})
"""Phases in which a rank waits on its peers, so silence there is a hang. Starting (loading data, perhaps from object
storage) and evaluating are a rank's own work, bounded by the run's timeout only; and a rank joining while a peer is
still starting is waiting for that peer, not stalled."""

BEAT_S = 5.0
"""A training rank tells the parent it is alive at most this often."""

STACK_WAIT_S = 2.0
"""How long the parent waits for a signalled rank to write its stack."""


class StalledRanks(WorkerError):
    """Ranks fell silent; ``restartable`` when none of them had started training."""

    def __init__(self, message: str, *, restartable: bool) -> None:
        super().__init__(message)
        self.restartable = restartable


@dataclass(slots=True)
class RankWatch:
    """Each rank's last phase and when it was last heard from (pure: the caller passes the clock's readings)."""

    stall_s: float
    now: float
    phase: dict[int, str] = field(default_factory=dict)
    heard: dict[int, float] = field(default_factory=dict)

    def start(self, ranks: Iterable[int]) -> None:
        for rank in ranks:
            self.hear(rank, "starting", self.now)

    def hear(self, rank: int, phase: str, now: float) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases: {', '.join(PHASES)}")
        self.phase[rank], self.heard[rank] = phase, now

    def stalled(self, now: float, done: Container[int]) -> list[int]:
        """Ranks that have not reported, wait on their peers (none of which is still starting) and have been silent
        longer than ``stall_s``."""
        if "starting" in self.phase.values():
            return []
        return sorted(
            r for r, phase in self.phase.items() if r not in done and phase in WAITING and now - self.heard[r] > self.stall_s
        )

    def describe(self, ranks: Iterable[int], now: float) -> str:
        return ", ".join(f"rank {r} silent {now - self.heard[r]:.0f} s while {self.phase[r]}" for r in ranks)

    def restartable(self, ranks: Iterable[int]) -> bool:
        return all(self.phase[r] in BEFORE_TRAINING for r in ranks)


def stack_file(folder: str, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.stack"


def dump_on_signal(folder: str, rank: int) -> IO[str]:
    """In a worker: write every thread's stack to ``stack_file`` on SIGUSR1 (keep the returned file open)."""
    out = stack_file(folder, rank).open("w")
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
    return out


def stacks_of(folder: str, procs: dict[int, Any]) -> str:
    """Signal each live rank in ``procs`` to write its stack and return what they wrote (best effort: a rank that has
    died or does not answer in STACK_WAIT_S is said so)."""
    for proc in procs.values():
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + STACK_WAIT_S
    while time.monotonic() < deadline and not all(_read(stack_file(folder, r)) for r in procs):
        time.sleep(0.1)
    time.sleep(0.2)  # a stack is written in one go from the signal handler: a moment more and it is whole
    texts = {r: _read(stack_file(folder, r)) for r in procs}
    return "\n".join(f"rank {r}'s stack:\n{texts.get(r) or '(none written: it had exited or did not answer)'}" for r in procs)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


__all__ = ["BEAT_S", "PHASES", "RankWatch", "StalledRanks", "dump_on_signal", "stacks_of"]
