"""``ddctl chaos``: inject a failure into a running job, on purpose, and watch it heal."""

from __future__ import annotations

from typing import Annotated

import typer

from ddctl.cli.output import print_json
from ddctl.cli.selection import JsonOption, RunOption, on_run


def preempt(
    region: Annotated[str, typer.Argument(help="Region whose learner is preempted.")],
    notice: Annotated[float, typer.Option(help="Seconds between the notice and the kill.")] = 30.0,
    run: RunOption = "",
    json_out: JsonOption = False,
) -> None:
    """Preempt one learner of a region: a notice, an early push of its pending drift, then the kill."""
    from ddctl.control.chaos import preempt

    result = on_run(run, lambda r, state: preempt(r, state, region, notice))
    if json_out:
        print_json(result)
    else:
        typer.echo(f"preempted {result['instance']} in {result['region']} ({result['seconds_to_exit']}s after its notice)")


def partition(
    region: Annotated[str, typer.Argument(help="Docker region to cut off from the syncer.")],
    seconds: Annotated[float, typer.Option("--for", help="Seconds the region stays cut off (then it is restored).")] = 30.0,
    run: RunOption = "",
    json_out: JsonOption = False,
) -> None:
    """Cut a region's network off from the syncer, then restore it; its learners keep training and rejoin."""
    from ddctl.control.chaos import partition

    def cut() -> None:
        if not json_out:
            typer.echo(f"{region} is cut off from the syncer for {seconds:g}s (Ctrl-C restores it early)", err=True)

    result = on_run(run, lambda r, state: partition(r, state, region, seconds, cut))
    if json_out:
        print_json(result)
    else:
        typer.echo(f"{result['region']} was cut off for {result['seconds']}s and is connected again")
