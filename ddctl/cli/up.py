"""``ddctl up``, ``status``, ``down`` and ``logs``: a job's lifecycle from the laptop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ddctl.cli.errors import run_guarded
from ddctl.cli.output import print_json, stdout

if TYPE_CHECKING:
    from ddctl.state import State

T = TypeVar("T")

RegionsOption = Annotated[Path, typer.Option("-f", "--file", help="The regions file.")]
RunOption = Annotated[str, typer.Option("--run", help="Run id (default: the latest run that is up).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def up(
    file: RegionsOption = Path("regions.yaml"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Play every region on this machine.")] = False,
    plan_only: Annotated[bool, typer.Option("--plan", help="Print what would be created and its $/h; create nothing.")] = False,
    follow: Annotated[bool, typer.Option("--follow", help="Stay attached and show the run's status until Ctrl-C.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Start the job described by the regions file; returns once it is training and leaves it running."""
    from ddctl.plan import plan_summary
    from ddctl.regions import load_regions
    from ddctl.state import State
    from ddctl.up import up_dry_run

    def body() -> dict[str, Any]:
        rf = load_regions(file)
        if plan_only:
            return plan_summary(rf, rf.run)
        if not dry_run:
            raise typer.BadParameter("cloud regions (aws, gcp) are not built yet; use --dry-run or --plan")
        with State() as state:
            return up_dry_run(rf, state, say=lambda text: typer.echo(text, err=True))

    result = run_guarded(body)
    if json_out:
        print_json(result)
    elif plan_only:
        _print_plan(result)
    else:
        typer.echo(
            f"run {result['run']} is training ({result['provider']} regions): first round merged after "
            f"{result['seconds_to_first_round']}s; follow it with `ddctl status`, stop it with `ddctl down`"
        )
    if follow and not plan_only:
        _follow(result["run"])


def _follow(run: str, every_s: float = 2.0) -> None:
    """Redraw the status table in place on a terminal (print it every ``every_s`` otherwise) until Ctrl-C;
    leaving never touches the run."""
    import sys
    import time

    from rich.live import Live

    from ddctl.observe import status as run_status

    def snapshot() -> Any:
        try:
            return _status_table(_on_run(run, run_status))
        except typer.Exit:
            return f"{run}: the syncer is unreachable right now; retrying"

    try:
        if sys.stdout.isatty():
            with Live(snapshot(), console=stdout(), auto_refresh=False) as live:
                while True:
                    time.sleep(every_s)
                    live.update(snapshot(), refresh=True)
        while True:
            stdout().print(snapshot())
            time.sleep(every_s)
    except KeyboardInterrupt:
        typer.echo(f"detached; {run} keeps running (`ddctl down` stops it)")


def _print_plan(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"plan for {result['run']}: {result['learners']} learners, syncer in {result['syncer_region']}")
    for col in ("instance", "region", "provider", "role", "type", "spot", "max $/h"):
        table.add_column(col)
    for i in result["instances"]:
        price = "-" if i["max_dollars_per_hour"] is None else f"{i['max_dollars_per_hour']:.2f}"
        table.add_row(i["name"], i["region"], i["provider"], i["role"], i["instance_type"] or "-", str(i["spot"]), price)
    stdout().print(table)
    unpriced = f" (no price cap in: {', '.join(result['unpriced'])})" if result["unpriced"] else ""
    typer.echo(f"at most ${result['max_dollars_per_hour']:.2f}/h{unpriced}; nothing was created")


def _on_run(run: str, action: Callable[[str, State], T]) -> T:
    """``action(run id, state)`` on the chosen run (default: the latest one that is up), errors as exit codes."""
    from ddctl.state import State
    from ddctl.up import latest_run

    def body() -> T:
        with State() as state:
            return action(latest_run(state, run), state)

    return run_guarded(body)


def status(run: RunOption = "", json_out: JsonOption = False) -> None:
    """One snapshot of the run: rounds, and each region's learners with their links."""
    from ddctl.observe import status as run_status

    result = _on_run(run, run_status)
    if json_out:
        print_json(result)
        return
    stdout().print(_status_table(result))


def _status_table(result: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=f"{result['run']}: {result['rounds']} rounds merged")
    for col in ("region", "provider", "learner", "state", "step", "tokens/s", "up Mbit/s", "down Mbit/s"):
        table.add_column(col)
    for region in result["regions"]:
        for entry in region["learners"]:
            up_rate, down_rate = entry["up_mbps"], entry["down_mbps"]
            table.add_row(
                region["name"],
                region["provider"],
                entry["id"],
                entry["state"],
                str(entry["step"]),
                f"{entry['tokens_per_s']:.0f}",
                "-" if up_rate is None else f"{up_rate:.1f}",
                "-" if down_rate is None else f"{down_rate:.1f}",
            )
    return table


def down(run: RunOption = "", json_out: JsonOption = False) -> None:
    """Stop and remove everything of the run (found by its label); safe to repeat."""
    from ddctl.up import down as run_down

    result = _on_run(run, run_down)
    if json_out:
        print_json(result)
    else:
        typer.echo(f"{result['run']}: stopped {len(result['stopped'])} instances")


def logs(region: Annotated[str, typer.Argument(help="Region name.")], run: RunOption = "") -> None:
    """Print the logs of every instance in a region."""
    from ddctl.observe import logs as run_logs

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
    import shutil

    from ddctl import deploy
    from ddctl.observe import ssh_target

    target, known_hosts = _on_run(run, lambda r, state: ssh_target(r, state, region, instance))
    if command:
        code, out, err = run_guarded(lambda: deploy.run_command(target, shlex_join(command)))
        typer.echo(out, nl=False)
        typer.echo(err, nl=False, err=True)
        raise typer.Exit(code)
    if shutil.which("ssh") is None:
        run_guarded(lambda: _fail("an interactive shell needs the OpenSSH client (`ssh`); give a command to run instead"))
    os.execvp("ssh", deploy.ssh_argv(target, known_hosts, []))


def shlex_join(argv: list[str]) -> str:
    import shlex

    return shlex.join(argv)


def _fail(message: str) -> None:
    from ddctl.errors import DdctlError

    raise DdctlError(message)


def chaos_preempt(
    region: Annotated[str, typer.Argument(help="Region whose learner is preempted.")],
    notice: Annotated[float, typer.Option(help="Seconds between the notice and the kill.")] = 30.0,
    run: RunOption = "",
    json_out: JsonOption = False,
) -> None:
    """Preempt one learner of a region: a notice, an early push of its pending drift, then the kill."""
    from ddctl.chaos import preempt

    result = _on_run(run, lambda r, state: preempt(r, state, region, notice))
    if json_out:
        print_json(result)
    else:
        typer.echo(f"preempted {result['instance']} in {result['region']} ({result['seconds_to_exit']}s after its notice)")
