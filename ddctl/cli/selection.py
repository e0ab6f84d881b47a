"""How every command picks its run: ``--run NAME``, else the only live run, else a clear error."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from ddctl.cli.errors import run_guarded

if TYPE_CHECKING:
    from ddctl.control.state import State

T = TypeVar("T")

RunOption = Annotated[str, typer.Option("--run", help="The run (default: the only live one; `ddctl ls` lists them).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def on_run(run: str, action: Callable[[str, State], T]) -> T:
    """``action(run id, state)`` on the chosen run (``control.runs.choose_run``), errors as exit codes."""
    from ddctl.control.runs import choose_run
    from ddctl.control.state import State

    def body() -> T:
        with State() as state:
            return action(choose_run(state, run), state)

    return run_guarded(body)
