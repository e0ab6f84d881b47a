"""The ``ddctl`` command: one small module per command group, wired here."""

from __future__ import annotations

import typer

from ddctl.cli import access, bench, chaos, replay, runs, simulate, syncer, train

app = typer.Typer(
    name="ddctl",
    help="Cross-region Decoupled DiLoCo training on preemptible GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("train")(train.train)
app.command("replay")(replay.replay)
app.command("simulate")(simulate.simulate)
app.command("up")(runs.up)
app.command("status")(runs.status)
app.command("down")(runs.down)
app.command("logs")(access.logs)
app.command("ssh")(access.ssh)
chaos_app = typer.Typer(help="Inject failures into a running job.", no_args_is_help=True)
chaos_app.command("preempt")(chaos.preempt)
chaos_app.command("partition")(chaos.partition)
app.add_typer(chaos_app, name="chaos")
app.add_typer(bench.app, name="bench")
app.add_typer(syncer.syncer_app, name="syncer")
app.add_typer(syncer.learner_app, name="learner")


def main() -> None:
    app()
