"""``ddctl replay TAPE``: reproduce a recorded run and check its parameters' hash."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ddctl.cli.errors import EXIT_DIVERGED, run_guarded
from ddctl.cli.output import print_json, print_table


def replay(
    tape: Annotated[Path, typer.Argument(help="Tape written by ddctl train --tape.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Replay a run from its event tape; exits 4 if the final parameters differ."""
    from ddctl.local.replay import replay_tape

    result = run_guarded(lambda: replay_tape(tape))
    if json_out:
        print_json(result)
    else:
        print_table(f"ddctl replay {tape}", result)
    if not result["match"]:
        raise typer.Exit(EXIT_DIVERGED)
