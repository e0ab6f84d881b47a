"""Errors of the laptop side that are not bad input to the agents (no torch needed).

DdctlError
├── WorkerError        a data-parallel worker failed, died or timed out
├── UnreachableError   a machine, the Docker engine or a syncer could not be reached
└── ReplayDivergence   a replay did something other than its tape recorded (also a TapeError)
"""

from __future__ import annotations

from ddctl_agents.errors import TapeError


class DdctlError(Exception):
    """Root of the laptop side's own errors."""


class WorkerError(DdctlError, RuntimeError):
    """A data-parallel worker failed, died or timed out; the message carries its traceback."""


class UnreachableError(DdctlError):
    """A machine (SSH), the Docker engine or a run's syncer did not answer; retrying later may work."""


class ReplayDivergence(DdctlError, TapeError):
    """The replayed run did something other than what the tape recorded."""
