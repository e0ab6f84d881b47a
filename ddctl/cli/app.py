"""The ``ddctl`` command: one small module per command group, wired here."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from typing import Annotated

import typer

from ddctl.cli import access, bench, catalog, chaos, data, pull, replay, runs, simulate, syncer, train
from ddctl.cli.help import HelpGroup

app = typer.Typer(
    name="ddctl",
    help="Cross-region Decoupled DiLoCo training on preemptible GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help that fits 80 columns: see ddctl/cli/help.py
    cls=HelpGroup,
)


def package_version() -> str:
    """The installed distribution's version, so ``--version`` names what pip installed (a source tree: ours)."""
    try:
        return installed_version("ddctl")
    except PackageNotFoundError:
        from ddctl import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ddctl {package_version()}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_print_version, is_eager=True, help="Print ddctl's version and exit."),
    ] = False,
    profile: Annotated[
        str | None,
        typer.Option("--profile", envvar="AWS_PROFILE", help="The AWS profile for aws regions (default: AWS_PROFILE)."),
    ] = None,
) -> None:
    # The options of ``ddctl`` itself (before any command); ``--version`` acts in its callback, eagerly.
    # The profile goes into the environment: this process's boto3 and the controller it starts both read it.
    if profile:
        os.environ["AWS_PROFILE"] = profile


app.command("train")(train.train)
app.command("replay")(replay.replay)
app.command("simulate")(simulate.simulate)
app.command("up")(runs.up)
app.command("status")(runs.status)
app.command("stop")(runs.stop)
app.command("down")(runs.down)
app.command("pull")(pull.pull)
app.command("ls")(catalog.ls)
app.command("gc")(catalog.gc)
app.command("logs")(access.logs)
app.command("ssh", context_settings=access.SSH_CONTEXT)(access.ssh)
chaos_app = typer.Typer(help="Inject failures into a running job.", no_args_is_help=True, cls=HelpGroup)
chaos_app.command("preempt")(chaos.preempt)
chaos_app.command("partition")(chaos.partition)
app.add_typer(chaos_app, name="chaos")
app.add_typer(bench.app, name="bench", cls=HelpGroup)
app.add_typer(data.app, name="data", cls=HelpGroup)
app.add_typer(syncer.syncer_app, name="syncer", cls=HelpGroup)
app.add_typer(syncer.learner_app, name="learner", cls=HelpGroup)


def main() -> None:
    app()
