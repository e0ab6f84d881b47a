"""``ddctl up``, ``status``, ``down`` and ``logs``: a job's lifecycle from the laptop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ddctl.cli.errors import run_guarded
from ddctl.cli.output import print_json, stdout

if TYPE_CHECKING:
    from ddctl.control.state import State

T = TypeVar("T")

RegionsOption = Annotated[Path, typer.Option("-f", "--file", help="The regions file.")]
RunOption = Annotated[str, typer.Option("--run", help="Run id (default: the latest run that is up).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def up(
    file: RegionsOption = Path("regions.yaml"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Play every region on this machine.")] = False,
    plan_only: Annotated[bool, typer.Option("--plan", help="Print what up would do and its $/h; change nothing.")] = False,
    follow: Annotated[bool, typer.Option("--follow", help="Stay attached and show the run's status until Ctrl-C.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Bring the run of the regions file up, or converge it if it runs (nothing twice); returns once it trains."""
    from ddctl.config.regions import load_regions
    from ddctl.control.state import State
    from ddctl.control.up import plan_actions, up

    def say(text: str) -> None:
        typer.echo(text, err=True)

    def body() -> dict[str, Any]:
        rf = load_regions(file)
        if plan_only:
            return plan_actions(rf, dry_run=dry_run, say=say)
        with State() as state:
            return up(rf, state, dry_run=dry_run, say=say)

    result = run_guarded(body)
    if json_out:
        print_json(result)
    elif plan_only:
        _print_plan(result)
    else:
        changed = ", ".join(f"{c['action']} {c['instance']}" for c in result["changed"]) or "nothing to change"
        typer.echo(
            f"run {result['run']} is training ({result['provider']} regions; {changed}): first round merged after "
            f"{result['seconds_to_first_round']}s; follow it with `ddctl status`, stop it with `ddctl down`"
        )
    if follow and not plan_only:
        _follow(result["run"])


def _follow(run: str) -> None:
    """The live dashboard until Ctrl-C; leaving never touches the run."""
    from ddctl.control.state import State
    from ddctl.dashboard.watch import watch

    with State() as state:
        watch(run, state, stdout())
    typer.echo(f"detached; {run} keeps running (`ddctl down` stops it)")


def _print_plan(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"plan for {result['run']}: {result['learners']} learners, syncer in {result['syncer_region']}")
    for col in ("instance", "region", "provider", "role", "type", "spot", "max $/h", "up would"):
        table.add_column(col)
    for i in result["instances"]:
        price = "-" if i["max_dollars_per_hour"] is None else f"{i['max_dollars_per_hour']:.2f}"
        table.add_row(
            i["name"], i["region"], i["provider"], i["role"], i["instance_type"] or "-", str(i["spot"]), price, i["action"]
        )
    stdout().print(table)
    unpriced = f" (no price cap in: {', '.join(result['unpriced'])})" if result["unpriced"] else ""
    typer.echo(f"at most ${result['max_dollars_per_hour']:.2f}/h{unpriced}; nothing was changed")


def _on_run(run: str, action: Callable[[str, State], T]) -> T:
    """``action(run id, state)`` on the chosen run (default: the latest one that is up), errors as exit codes."""
    from ddctl.control.state import State
    from ddctl.control.up import latest_run

    def body() -> T:
        with State() as state:
            return action(latest_run(state, run), state)

    return run_guarded(body)


def status(
    run: RunOption = "",
    watch: Annotated[bool, typer.Option("--watch", help="A live dashboard, redrawn in place until Ctrl-C.")] = False,
    every: Annotated[float, typer.Option(min=0.2, help="Seconds between questions to the syncer.")] = 1.0,
    json_out: JsonOption = False,
) -> None:
    """The run at a glance: learners with their links, the job's rounds and books, and recent events.

    Exit code 6 when the syncer cannot be reached (the snapshot still shows what ddctl knows)."""
    from ddctl.dashboard.render import render
    from ddctl.dashboard.watch import snapshot
    from ddctl.dashboard.watch import watch as live

    if watch and not json_out:

        def follow(r: str, state: State) -> None:
            live(r, state, stdout(), every_s=every)

        _on_run(run, follow)
        return
    result = _on_run(run, snapshot)
    if json_out:
        print_json(result)
    else:
        console = stdout()
        console.print(render(result, console.width, 10_000))
    if not result["syncer"]["reachable"]:
        raise typer.Exit(6)


def down(run: RunOption = "", json_out: JsonOption = False) -> None:
    """Stop and remove everything of the run (found by its label); safe to repeat."""
    from ddctl.control.down import down as run_down

    result = _on_run(run, run_down)
    if json_out:
        print_json(result)
    else:
        typer.echo(f"{result['run']}: stopped {len(result['stopped'])} instances")


def logs(region: Annotated[str, typer.Argument(help="Region name.")], run: RunOption = "") -> None:
    """Print the logs of every instance in a region."""
    from ddctl.control.observe import logs as run_logs

    for name, text in _on_run(run, lambda r, state: run_logs(r, state, region)).items():
        typer.echo(f"==> {name} <==")
        typer.echo(text.rstrip())


def ssh(
    region: Annotated[str, typer.Argument(help="Region name.")],
    command: Annotated[list[str] | None, typer.Argument(help="Run this instead of an interactive shell.")] = None,
    instance: Annotated[str, typer.Option(help="Instance name (default: the region's first learner).")] = "",
    run: RunOption = "",
) -> None:
    """Open a shell on (or run a command in) a machine of a region, with the run's key and its pinned host key."""
    import os
    import shlex
    import shutil

    from ddctl.control.observe import ssh_target
    from ddctl.errors import DdctlError
    from ddctl.providers import deploy

    def connect(r: str, state: State) -> tuple[int, str, str] | list[str]:
        """The command's (status, stdout, stderr), or the OpenSSH command line of an interactive shell."""
        target, known_hosts = ssh_target(r, state, region, instance)
        if command:
            return deploy.run_command(target, shlex.join(command))
        if shutil.which("ssh") is None:
            raise DdctlError("an interactive shell needs the OpenSSH client (`ssh`); give a command to run instead")
        return deploy.ssh_argv(target, known_hosts, [])

    result = _on_run(run, connect)
    if isinstance(result, list):
        os.execvp("ssh", result)
    code, out, err = result
    typer.echo(out, nl=False)
    typer.echo(err, nl=False, err=True)
    raise typer.Exit(code)


def chaos_preempt(
    region: Annotated[str, typer.Argument(help="Region whose learner is preempted.")],
    notice: Annotated[float, typer.Option(help="Seconds between the notice and the kill.")] = 30.0,
    run: RunOption = "",
    json_out: JsonOption = False,
) -> None:
    """Preempt one learner of a region: a notice, an early push of its pending drift, then the kill."""
    from ddctl.control.chaos import preempt

    result = _on_run(run, lambda r, state: preempt(r, state, region, notice))
    if json_out:
        print_json(result)
    else:
        typer.echo(f"preempted {result['instance']} in {result['region']} ({result['seconds_to_exit']}s after its notice)")


def chaos_partition(
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

    result = _on_run(run, lambda r, state: partition(r, state, region, seconds, cut))
    if json_out:
        print_json(result)
    else:
        typer.echo(f"{result['region']} was cut off for {result['seconds']}s and is connected again")
