"""The one place where errors become exit codes and one-line messages.

Exit codes: 0 success; 1 unexpected internal error; 2 bad usage or settings;
3 bad input data (corpus, tape, payload, checkpoint); 4 a replay that diverged from its
tape; 5 a data-parallel worker failed; 6 a machine, the Docker engine or
a syncer could not be reached; 7 a provider could not provision (capacity,
quota, credentials: the message says which); 130 interrupted (Ctrl-C). The
README lists the same codes (a test holds it to the ``EXIT_`` names here), and
the agents end with the same numbers (``ddctl_agents.entrypoint``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

import typer

from ddctl.errors import DdctlError, ProvisionError, ReplayDivergence, UnreachableError, WorkerError
from ddctl_agents.errors import AgentError, CheckpointError, TapeError, Unavailable, WireError

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_DATA, EXIT_DIVERGED, EXIT_WORKER, EXIT_UNREACHABLE, EXIT_PROVISION = range(8)
EXIT_INTERRUPTED = 130
"""128 + SIGINT, as a shell reports a program that Ctrl-C ended."""

EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (ReplayDivergence, EXIT_DIVERGED),
    (TapeError, EXIT_DATA),
    (WireError, EXIT_DATA),
    (CheckpointError, EXIT_DATA),
    (Unavailable, EXIT_UNREACHABLE),
    (AgentError, EXIT_USAGE),
    (FileExistsError, EXIT_USAGE),
    (WorkerError, EXIT_WORKER),
    (UnreachableError, EXIT_UNREACHABLE),
    (ProvisionError, EXIT_PROVISION),
    (DdctlError, EXIT_USAGE),
    (ConnectionError, EXIT_UNREACHABLE),
    (TimeoutError, EXIT_UNREACHABLE),
    (OSError, EXIT_USAGE),
)
"""First match wins, so subclasses come before their parents. An OSError that reaches the boundary is a path the
command was given that cannot be used (a folder that does not exist, a file where a folder is needed, a name too
long): its message names the path and the reason."""

T = TypeVar("T")


def exit_code_for(exc: BaseException) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_INTERNAL


def run_guarded(action: Callable[[], T]) -> T:
    """Run a command body; known errors print ``ddctl: error: ...`` and exit with their code."""
    try:
        return action()
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        sys.stderr.write("ddctl: interrupted\n")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except Exception as exc:  # noqa: BLE001 - the boundary where every error becomes an exit code
        code = exit_code_for(exc)
        if code == EXIT_INTERNAL:
            raise
        sys.stderr.write(f"ddctl: error: {exc}\n")
        raise typer.Exit(code) from None
