"""``ddctl replay TAPE...``: reproduce a recorded run (one tape, or one per synchronizer shard) and check its
parameters' hash; ``--run RUN`` finds the tape of a run ``ddctl up`` made."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ddctl.cli.errors import EXIT_DIVERGED, run_guarded
from ddctl.cli.output import print_json, print_table


def replay(
    tapes: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="TAPE",
            help="Tape written by ddctl train --tape or by a synchronizer (STATE_DIR/tape.jsonl); a sharded run's: "
            "every shard's, in any order.",
            show_default=False,
        ),
    ] = None,
    run: Annotated[
        str, typer.Option("--run", help="A run ddctl up made (its synchronizer's tape, every shard's), instead of TAPE.")
    ] = "",
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Replay a run from its event tapes (merged in a causal order); exits 4 if the final parameters differ."""
    from ddctl.control.rundir import RunDir
    from ddctl.local.replay import replay_tapes

    if bool(tapes) == bool(run):
        raise typer.BadParameter("give the run's tapes (TAPE...) or --run RUN, one of the two")
    tapes = tapes or run_guarded(RunDir(run).tapes)
    result = run_guarded(lambda: replay_tapes(tapes))
    if json_out:
        print_json(result)
    else:
        print_table(f"ddctl replay {' '.join(str(t) for t in tapes)}", result)
    if not result["match"]:
        raise typer.Exit(EXIT_DIVERGED)
