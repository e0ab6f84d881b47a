"""``ddctl logs`` and ``ddctl ssh``: looking into a run's machines from the laptop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from ddctl.cli.selection import RunOption, on_run

if TYPE_CHECKING:
    from ddctl.control.state import State


def logs(region: Annotated[str, typer.Argument(help="Region name.")], run: RunOption = "") -> None:
    """Print the logs of every instance in a region."""
    from ddctl.control.observe import logs as run_logs

    for name, text in on_run(run, lambda r, state: run_logs(r, state, region)).items():
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

    result = on_run(run, connect)
    if isinstance(result, list):
        os.execvp("ssh", result)
    code, out, err = result
    typer.echo(out, nl=False)
    typer.echo(err, nl=False, err=True)
    raise typer.Exit(code)
