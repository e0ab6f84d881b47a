"""``ddctl logs`` and ``ddctl ssh``: looking into a run's machines from the laptop.

Both take a region or an instance name (``L1``, ``syncer``, ``controller``); without one they list the
run's instances and say how to pick one. ``ssh`` passes its command the way OpenSSH does (words joined by
spaces, for the remote shell), and like ``ssh`` it reads everything after the name as that command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from ddctl.cli.selection import RunOption, on_run

if TYPE_CHECKING:
    from ddctl.control.state import State

SSH_CONTEXT: dict[str, Any] = {"allow_interspersed_args": False}
"""As with ``ssh host ls -la``: ddctl's options come before the name; every word after it is the command."""
NameArgument = Annotated[
    str, typer.Argument(help="A region, or an instance (L0, syncer, controller); none: list them.", show_default=False)
]


def _list_instances(run: str, state: State, verb: str) -> None:
    """What ``verb`` can be pointed at, as a table, and how: asked with no name, this is the answer, not an error."""
    from ddctl.control.observe import listing

    rows = listing(run, state)
    if not rows:
        typer.echo(f"run {run} has no instances")
        return
    example = next((r["region"] for r in rows if r["role"] == "learner" and r["region"]), rows[0]["instance"])
    typer.echo(f"run {run}: name a region or an instance, e.g. `ddctl {verb} {example}` or `ddctl {verb} syncer`")
    header = {"region": "REGION", "instance": "INSTANCE", "role": "ROLE", "state": "STATE"}
    widths = {k: max(len(row[k] or "-") for row in [header, *rows]) for k in header}
    for row in [header, *rows]:
        typer.echo("  ".join(f"{row[k] or '-':<{widths[k]}}" for k in header).rstrip())


def terminal_safe(line: str) -> str:
    """A log line as an agent (or a VM) wrote it, its control characters escaped but its tabs kept: an escape
    sequence in it must not act on the operator's terminal, nor a newline forge a line."""
    from ddctl_agents.core.text import printable

    return "\t".join(printable(part, 10 * len(part) + 16) for part in line.split("\t"))


def logs(
    name: NameArgument = "",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until Ctrl-C.")] = False,
    since: Annotated[
        str, typer.Option(help="Only lines from this long ago (90s, 5m, 1h) or after this ISO time.", show_default=False)
    ] = "",
    run: RunOption = "",
) -> None:
    """Print the logs of a region's instances, or of one instance: collected here, and a running VM's over SSH.

    With --follow, new lines are printed as they come until Ctrl-C, which stops only this command: the run
    goes on. Lines are prefixed with their instance's name when several instances are shown."""
    import contextlib
    import time

    from ddctl.control import observe
    from ddctl.control.loglines import parse_since

    def show(r: str, state: State) -> None:
        if not name:
            _list_instances(r, state, "logs")
            return
        after = parse_since(since, time.time()) if since else None
        chosen = [c.name for c in observe.choose(r, state, name)]
        width = max(len(c) for c in chosen)

        def emit(instance: str, line: str) -> None:
            shown = terminal_safe(line)
            typer.echo(f"{instance:<{width}} | {shown}" if len(chosen) > 1 else shown)

        if not follow:
            for instance, lines in observe.logs(r, state, name, after).items():
                for line in lines:
                    emit(instance, line)
            return
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the following, and only that: exit 0
            observe.follow(r, state, name, emit, after)

    on_run(run, show)


def ssh(
    name: NameArgument = "",
    command: Annotated[
        list[str] | None,
        typer.Argument(help="Run this instead of a shell: the words joined by spaces, for the remote shell, as ssh does."),
    ] = None,
    instance: Annotated[str, typer.Option(help="Instance name (default: the region's first learner).")] = "",
    run: RunOption = "",
) -> None:
    """Open a shell on (or run a command in) a region's or an instance's machine, with the run's key and its pinned
    host key: `ddctl ssh eu-west -- 'ls -la ~; ps aux'`, `ddctl ssh syncer`. Options go before the name."""
    import os
    import shutil
    import sys

    from ddctl.control.observe import ssh_target
    from ddctl.errors import DdctlError
    from ddctl.providers import deploy

    words = list(command or [])
    if words[:1] == ["--"]:  # `ddctl ssh eu-west -- cmd`: the `--` only ends ddctl's options
        words = words[1:]
    remote = deploy.openssh_command(words)

    def connect(r: str, state: State) -> int | list[str] | None:
        """The command's exit status (its output written as it comes), the OpenSSH command line of a shell, or None
        (listed)."""
        if not name and not instance:
            _list_instances(r, state, "ssh")
            return None
        target, known_hosts = ssh_target(r, state, name, instance)
        if remote:
            return deploy.relay_command(target, remote, sys.stdout.buffer, sys.stderr.buffer)
        if shutil.which("ssh") is None:
            raise DdctlError("an interactive shell needs the OpenSSH client (`ssh`); give a command to run instead")
        return deploy.ssh_argv(target, known_hosts, [])

    result = on_run(run, connect)
    if result is None:
        return
    if isinstance(result, list):
        os.execvp("ssh", result)
    raise typer.Exit(result)
