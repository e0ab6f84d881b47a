"""``ddctl syncer ...`` and ``ddctl learner run``: the agents' own entry points, from the laptop.

``serve`` and ``run`` hand their arguments unchanged to the agents' mains, so
``ddctl syncer serve ARGS`` on a laptop and ``python -m ddctl_agents.service
ARGS`` on a VM are the same program with the same flags (``--help`` included).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated

import typer

from ddctl.cli.errors import run_guarded
from ddctl.cli.output import print_json

syncer_app = typer.Typer(help="Run or prepare the synchronizer service.", no_args_is_help=True)
learner_app = typer.Typer(help="Run a learner agent.", no_args_is_help=True)
FORWARD = {"allow_extra_args": True, "ignore_unknown_options": True}


@syncer_app.command("init")
def init(
    directory: Annotated[Path, typer.Argument(help="New job directory: job.json, secret, tls/.")],
    preset: Annotated[str, typer.Option(help="Model preset.")] = "tiny",
    learners: Annotated[int, typer.Option(help="M: learners (one data shard each, named L0..L{M-1}).")] = 3,
    tokens: Annotated[int, typer.Option(help="Total token budget over all learners.")] = 1_000_000,
    fragments: Annotated[int, typer.Option(help="P: fragments.")] = 8,
    inner_steps: Annotated[int, typer.Option(help="H: inner steps between two sends of a fragment.")] = 24,
    quorum: Annotated[int, typer.Option(help="K: updates needed before a round may close.")] = 1,
    grace: Annotated[bool, typer.Option(help="Adaptive grace window.")] = True,
    codec: Annotated[str, typer.Option(help="Outer-gradient codec: fp32, bf16, int8, int4, int2, int1.")] = "int4",
    batch_size: Annotated[int, typer.Option(help="Sequences per inner step.")] = 8,
    max_bytes: Annotated[int, typer.Option(help="Read at most this many corpus bytes.")] = 24 * 2**20,
    seed: Annotated[int, typer.Option(help="Model and data seed.")] = 0,
    host: Annotated[
        list[str] | None, typer.Option(help="Address the syncer is reached at (repeat); goes in the certificate.")
    ] = None,
    run: Annotated[str, typer.Option(help="Run id (default: random).")] = "",
    tls: Annotated[bool, typer.Option(help="Generate the run's CA and server certificate.")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Create a job directory for ``ddctl syncer serve``."""
    from ddctl.credentials import init_job_dir
    from ddctl_agents.core.outer import OuterConfig
    from ddctl_agents.core.quorum import QuorumConfig
    from ddctl_agents.core.syncer import SyncerConfig
    from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget
    from ddctl_agents.train.job import JobConfig
    from ddctl_agents.train.learner import SyncSettings

    def body() -> None:
        job = JobConfig(
            inner=InnerConfig(preset=preset, batch_size=batch_size, seed=seed),
            data=DataConfig(max_bytes=max_bytes),
            budget=RunBudget(tokens=tokens, learners=learners),
            sync=SyncSettings(fragments=fragments, inner_steps=inner_steps, codec=codec),
            syncer=SyncerConfig(quorum=QuorumConfig(quorum=quorum, grace=grace), outer=OuterConfig(), inner_steps=inner_steps),
        )
        run_id = run or f"run-{secrets.token_hex(4)}"
        init_job_dir(directory, job, run_id, host or ["127.0.0.1", "localhost"], tls=tls)
        result = {"run": run_id, "job_dir": str(directory), "tls": tls, "learners": [f"L{i}" for i in range(learners)]}
        if json_out:
            print_json(result)
        else:
            typer.echo(f"job {run_id} in {directory}; start it with: ddctl syncer serve --job-dir {directory}")

    run_guarded(body)


@syncer_app.command("token")
def token(
    directory: Annotated[Path, typer.Argument(help="The job directory.")],
    identity: Annotated[str, typer.Argument(help="A learner name (L0, L1, ...) or 'admin'.")],
) -> None:
    """Print the token ``identity`` presents to this job's syncer."""
    from ddctl.credentials import token_for

    run_guarded(lambda: typer.echo(token_for(directory, identity)))


@syncer_app.command("readmit")
def readmit(
    learner: Annotated[str, typer.Argument(help="The suspended learner (L0, L1, ...).")],
    run: Annotated[str, typer.Option(help="The run (default: the latest one that is up).")] = "",
    url: Annotated[str, typer.Option(help="A syncer that ddctl up did not start: its URL (with --job-dir).")] = "",
    job_dir: Annotated[Path | None, typer.Option(help="That syncer's job directory (admin token and CA).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the syncer's answer as JSON.")] = False,
) -> None:
    """Let a learner that the syncer suspended for bad updates back in; it registers again on its own."""
    from ddctl.syncer_admin import readmit as readmit_learner

    result = run_guarded(lambda: readmit_learner(learner, run=run, url=url, job_dir=job_dir))
    if json_out:
        print_json(result)
    else:
        typer.echo(f"{result['learner']}: {result['reason']}")


@syncer_app.command("serve", context_settings=FORWARD, add_help_option=False)
def serve(ctx: typer.Context) -> None:
    """Run the synchronizer service (same flags as python -m ddctl_agents.service; --help lists them)."""
    from ddctl_agents.service import server

    raise typer.Exit(server.main(list(ctx.args)))


@learner_app.command("run", context_settings=FORWARD, add_help_option=False)
def learner_run(ctx: typer.Context) -> None:
    """Run one learner (same flags as python -m ddctl_agents.agent; --help lists them)."""
    from ddctl_agents.agent.run import main

    raise typer.Exit(main(list(ctx.args)))
