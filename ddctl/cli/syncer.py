"""``ddctl syncer ...`` and ``ddctl learner run``: the agents' own entry points, from the laptop.

``serve`` and ``run`` hand their arguments unchanged to the agents' mains, so
``ddctl syncer serve ARGS`` on a laptop and ``python -m ddctl_agents.service
ARGS`` on a VM are the same program with the same flags (``--help`` included).
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ddctl.cli.choices import Codec
from ddctl.cli.errors import EXIT_UNREACHABLE, run_guarded
from ddctl.cli.output import print_json
from ddctl.config.job import build_job, default
from ddctl.errors import DdctlError
from ddctl_agents.core import shardmap
from ddctl_agents.relay import HOSTNAME

if TYPE_CHECKING:
    from ddctl_agents.agent.client import SyncerClient

SHARD_MAP = "shards.json"
"""Where ``init --shards N`` writes the job's shard map."""

JobDirArg = Annotated[
    Path | None, typer.Argument(help="The job directory (admin token, CA), with every shard's --syncer; or --run.")
]
SyncerOpt = Annotated[list[str] | None, typer.Option("--syncer", help="A shard's URL; repeat for every shard.")]
RunOpt = Annotated[str, typer.Option("--run", help="A sharded run ddctl up made, instead of JOB_DIR and --syncer.")]

syncer_app = typer.Typer(help="Run or prepare the synchronizer service.", no_args_is_help=True)
learner_app = typer.Typer(help="Run a learner agent.", no_args_is_help=True)
FORWARD = {"allow_extra_args": True, "ignore_unknown_options": True}


@syncer_app.command("init")
def init(
    directory: Annotated[Path, typer.Argument(help="New job directory: job.json, secret, tls/.")],
    preset: Annotated[str | None, typer.Option(help=f"Model preset [default: {default('preset')}].")] = None,
    learners: Annotated[int, typer.Option(help="M: learners (one data shard each, named L0..L{M-1}).")] = 3,
    tokens: Annotated[int | None, typer.Option(help=f"Total token budget [default: {default('tokens')}].")] = None,
    fragments: Annotated[int | None, typer.Option(help=f"P: fragments [default: {default('fragments')}].")] = None,
    inner_steps: Annotated[
        int | None, typer.Option(help=f"H: inner steps between sends [default: {default('inner_steps')}].")
    ] = None,
    quorum: Annotated[int | None, typer.Option(help=f"K: updates a round needs [default: {default('quorum')}].")] = None,
    grace: Annotated[bool | None, typer.Option(help="Adaptive grace window [default: on].")] = None,
    codec: Annotated[Codec | None, typer.Option(help=f"Outer-gradient codec [default: {default('codec')}].")] = None,
    batch_size: Annotated[int | None, typer.Option(help=f"Sequences per inner step [default: {default('batch_size')}].")] = None,
    max_bytes: Annotated[
        int | None, typer.Option(help=f"Read at most this many corpus bytes [default: {default('max_bytes')}].")
    ] = None,
    seed: Annotated[int | None, typer.Option(help=f"Model and data seed [default: {default('seed')}].")] = None,
    host: Annotated[
        list[str] | None, typer.Option(help="Address the syncer is reached at (repeat); goes in the certificate.")
    ] = None,
    run: Annotated[str, typer.Option(help="Run id (default: random).")] = "",
    tls: Annotated[bool, typer.Option(help="Generate the run's CA and server certificate.")] = True,
    shards: Annotated[
        int,
        typer.Option(min=1, help="Synchronizer shards (fragments round robin); >1 writes shards.json for serve --shard-map."),
    ] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Create a job directory for ``ddctl syncer serve``."""
    from ddctl.control.credentials import init_job_dir

    knobs = {
        "preset": preset, "learners": learners, "tokens": tokens, "fragments": fragments, "inner_steps": inner_steps,
        "quorum": quorum, "grace": grace, "codec": codec and codec.value, "batch_size": batch_size,
        "max_bytes": max_bytes, "seed": seed,
    }  # fmt: skip

    def body() -> None:
        job = build_job(knobs)
        shard_map = shardmap.round_robin(shards, job.sync.fragments) if shards > 1 else None  # checked before writing
        run_id = run or f"run-{secrets.token_hex(4)}"
        hosts = host or ["127.0.0.1", "localhost"]
        check_init_names(run_id, hosts)
        init_job_dir(directory, job, run_id, hosts, tls=tls)
        result = {"run": run_id, "job_dir": str(directory), "tls": tls, "learners": [f"L{i}" for i in range(learners)]}
        serve = [f"ddctl syncer serve --job-dir {directory}"]
        if shard_map is not None:
            (directory / SHARD_MAP).write_text(json.dumps(shard_map.to_json(), indent=2) + "\n")
            result["shard_map"] = shard_map.to_json()
            serve = [f"{serve[0]} --shard-map {directory / SHARD_MAP} --shard {s} --state-dir {directory}/state-{s}"
                     for s in shard_map.shards]  # fmt: skip
        if json_out:
            print_json(result | {"serve": serve})
        else:
            typer.echo(f"job {run_id} in {directory}; start it with:\n  " + "\n  ".join(serve))

    run_guarded(body)


def check_learner_name(directory: Path, identity: str) -> None:
    """A learner's token only for a learner the job has (its job.json's learners): L7 of a 3-learner job is a typo."""
    from ddctl_agents.service.server import load_job_dir

    if not re.fullmatch(r"L\d{1,6}", identity):
        return
    learners = load_job_dir(directory).job.budget.learners  # a job directory it cannot read: says which file and why
    if int(identity[1:]) >= learners:
        raise DdctlError(f"{identity}: this job has learners L0..L{learners - 1}")


def check_init_names(run: str, hosts: list[str]) -> None:
    """The run's name (as a regions file allows it) and the hosts its certificate names, checked before the job
    directory is written."""
    from ddctl.config.regions import NAME_PATTERN

    if not re.fullmatch(NAME_PATTERN, run):
        raise DdctlError(f"--run {run[:60]!r}: a run's name is 1-40 letters, digits, '-' or '_', starting with a letter or digit")
    for name in hosts:
        try:
            ipaddress.ip_address(name)
        except ValueError:
            if not HOSTNAME.fullmatch(name):
                raise DdctlError(f"--host {name[:60]!r}: give an IP address or a DNS name the syncer is reached at") from None


@syncer_app.command("token")
def token(
    directory: Annotated[Path, typer.Argument(help="The job directory.")],
    identity: Annotated[str, typer.Argument(help="A learner name (L0, L1, ...), 'admin', or a relay's relay-REGION.")] = "",
    relay: Annotated[str, typer.Option(help="The token for REGION's relay instead (a learner of that region's).")] = "",
    relay_key: Annotated[
        bool, typer.Option("--relay-key", help="Print REGION's relay key (hex; the relay's --key-file) instead.")
    ] = False,
    relay_cert: Annotated[
        bool,
        typer.Option(
            "--relay-cert", help="Make REGION's relay certificate and key (the job's CA signs it) and print their paths."
        ),
    ] = False,
) -> None:
    """Print the token ``identity`` presents to this job's syncer (or to its region's relay with --relay REGION)."""
    from ddctl.control.credentials import relay_key_for, relay_tls, relay_token_for, token_for
    from ddctl.errors import DdctlError

    def answer() -> str:
        if (relay_key or relay_cert) and not relay:
            flag = "--relay-key" if relay_key else "--relay-cert"
            raise DdctlError(f"{flag} is for a region's relay: name the region with --relay REGION")
        if relay_key:
            return relay_key_for(directory, relay).hex()
        if relay_cert:
            return "\n".join(str(path) for path in relay_tls(directory, relay))
        if not identity:
            raise DdctlError("name the identity: a learner (L0, L1, ...), admin, or relay-REGION for a relay")
        check_learner_name(directory, identity)
        return relay_token_for(directory, relay, identity) if relay else token_for(directory, identity)

    run_guarded(lambda: typer.echo(answer()))


@syncer_app.command("readmit")
def readmit(
    learner: Annotated[str, typer.Argument(help="The suspended learner (L0, L1, ...).")],
    run: Annotated[str, typer.Option(help="The run (default: the latest one that is up).")] = "",
    url: Annotated[str, typer.Option(help="A syncer that ddctl up did not start: its URL (with --job-dir).")] = "",
    job_dir: Annotated[Path | None, typer.Option(help="That syncer's job directory (admin token and CA).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the syncer's answer as JSON.")] = False,
) -> None:
    """Let a learner that the syncer suspended for bad updates back in; it registers again on its own."""
    from ddctl.control.syncer_admin import readmit as readmit_learner

    result = run_guarded(lambda: readmit_learner(learner, run=run, url=url, job_dir=job_dir))
    if json_out:
        print_json(result)
    else:
        typer.echo(f"{result['learner']}: {result['reason']}")


@syncer_app.command("checkpoint")
def checkpoint(
    out: Annotated[Path, typer.Option("--out", help="A new directory for the checkpoint (ddctl pull --from reads it).")],
    job_dir: JobDirArg = None,
    syncer: SyncerOpt = None,
    run: RunOpt = "",
    evaluate: Annotated[bool, typer.Option(help="Measure the joined model's val_bpb here.")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """A consistent global checkpoint of a sharded synchronizer: every shard's part at one cut, joined into one model."""
    from ddctl.control.global_checkpoint import job_assembly, take

    def body() -> dict[str, Any]:
        job, urls, connect = shard_clients(job_dir, syncer, run)
        assembly = job_assembly(job) if evaluate else None
        return take(
            urls,
            connect,
            out,
            evaluate=assembly.evaluate if assembly is not None else None,
            shapes={n: tuple(t.shape) for n, t in assembly.initial.items()} if assembly is not None else None,
        )

    result = run_guarded(body)
    if json_out:
        print_json(result)
    else:
        bpb = "" if result["val_bpb"] is None else f", val_bpb {result['val_bpb']:.4f}"
        typer.echo(f"checkpoint {result['cut']} of shards {', '.join(result['shards'])} in {result['path']}{bpb}")


@syncer_app.command("move")
def move(
    fragment: Annotated[int, typer.Option(help="The fragment to move.")],
    to: Annotated[str, typer.Option(help="The shard that takes it (S0, S1, ...).")],
    job_dir: JobDirArg = None,
    syncer: SyncerOpt = None,
    run: RunOpt = "",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Move one fragment to another shard of a running sharded synchronizer (run it again to finish a broken move)."""
    from ddctl.control.handoff import move as move_fragment

    def body() -> dict[str, Any]:
        _, urls, connect = shard_clients(job_dir, syncer, run)
        return move_fragment(urls, connect, fragment, to)

    result = run_guarded(body)
    if json_out:
        print_json(result)
    elif result["moved"]:
        typer.echo(f"fragment {fragment}: {result['from']} -> {result['to']} at shard map epoch {result['epoch']}")
    else:
        typer.echo(result["reason"])


@syncer_app.command("replan")
def replan(
    job_dir: Annotated[Path, typer.Argument(help="The job directory (admin token, CA, job.json).")],
    regions: Annotated[Path, typer.Option("--regions", help="The regions file: priors, relays and re-plan settings.")],
    syncer: Annotated[list[str], typer.Option("--syncer", help="A shard's URL; repeat for every shard.")],
    site: Annotated[list[str], typer.Option("--site", help="SHARD=REGION: where a shard runs; repeat for every shard.")],
    every: Annotated[float, typer.Option(help="Seconds between looks at the shards.", min=0.5, max=3600)] = 10.0,
    for_s: Annotated[float, typer.Option("--for", help="Stop after this many seconds (0: until interrupted).", min=0)] = 0.0,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per look (JSON Lines).")] = False,
) -> None:
    """Move fragments between the running shards when the measured links call for it (re-plan settings: the
    regions file's synchronizer.replan); prints each re-plan with its cause."""
    import time

    from ddctl.config.regions import load_regions
    from ddctl.control.replanning import for_job, parse_sites, watch
    from ddctl.control.syncer_admin import admin_connector, checked_urls
    from ddctl_agents.service.server import load_job_dir

    looks = {"answered": 0, "failed": 0}

    def show(event: dict[str, Any]) -> None:
        looks["failed" if "error" in event else "answered"] += 1
        if json_out:
            typer.echo(json.dumps(event, sort_keys=True))
        elif "error" in event:
            typer.echo(f"look failed (trying again): {event['error']}", err=True)
        elif event.get("replan") is not None:
            r = event["replan"]
            moves = ", ".join(
                f"fragment {m['fragment']} {m['from']} -> {m['to']} ({m['shard']}"
                + (f"; failed, a later look finishes it: {m['error']})" if "error" in m else ")")
                for m in r["moves"]
            )
            typer.echo(f"re-plan: {moves}: {r['cause']}")

    def body() -> int:
        urls = checked_urls(syncer, "--syncer")
        connect = admin_connector(job_dir)
        loop = for_job(load_regions(regions), load_job_dir(job_dir).job, urls, connect, parse_sites(site))
        deadline = time.monotonic() + for_s if for_s else float("inf")
        return watch(loop, every, until=lambda: time.monotonic() >= deadline, on_event=show)

    made = run_guarded(body)
    if not json_out:
        typer.echo(f"{made} re-plan(s)")
    if looks["failed"] and not looks["answered"]:
        typer.echo(f"ddctl: error: none of {looks['failed']} look(s) reached the shards", err=True)
        raise typer.Exit(EXIT_UNREACHABLE)


@syncer_app.command("status")
def shard_status(
    job_dir: JobDirArg = None,
    syncer: SyncerOpt = None,
    run: RunOpt = "",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """A sharded synchronizer's shards side by side and the job's figures from all of them (exit 6 if one is down)."""
    from ddctl.control.shard_status import gather, summarize

    def body() -> dict[str, Any]:
        _, urls, connect = shard_clients(job_dir, syncer, run)
        return summarize(gather(urls, connect))

    result = run_guarded(body)
    if json_out:
        print_json(result)
    else:
        _print_shards(result)
    if result["job"]["partial"]:
        raise typer.Exit(EXIT_UNREACHABLE)


def _print_shards(result: dict[str, Any]) -> None:
    """The shards' table; every cell is literal text (a shard's answer names things: never read as rich markup)."""
    from rich.table import Table
    from rich.text import Text

    from ddctl.cli.output import stdout
    from ddctl_agents.core.text import printable

    def add_row(*cells: Any) -> None:
        table.add_row(*(Text(printable(str(cell), 200)) for cell in cells))

    table = Table("shard", "url", "site: up / down Mbit/s", "epoch", "fragments", "rounds", "live", "received", "merged",
                  "pending", "balanced")  # fmt: skip
    for row in result["shards"]:
        if not row["reachable"]:
            add_row("?", row["url"], *[""] * 8, f"unreachable: {str(row['error'])[:60]}")
            continue
        books, owned = row["ledger"], ",".join(map(str, row["owned"] or []))
        site = row["site"]
        link = " / ".join("-" if site[k] is None else f"{site[k]:.1f}" for k in ("up_mbps", "down_mbps"))
        cells = [row["shard"], row["url"], f"{site['name'] or '?'}: {link}", row["epoch"], owned, row["rounds"], len(row["live"])]
        add_row(*cells, books["received"], books["merged"], books["pending"], row["balanced"])
    job = result["job"]
    if "ledger" in job:
        books, partial = job["ledger"], " (partial)" if job["partial"] else ""
        unknown = "; ".join(f"{label}: {','.join(map(str, job[key]))}" for key, label in
                            (("unheard", "unknown"), ("handoff", "handing off")) if job.get(key))  # fmt: skip
        cells = ["job", "", "", job.get("epoch", ""), unknown, job["rounds"], len(job["live"]), books["received"]]
        add_row(*cells, books["merged"], books["pending"], f"{job['balanced']}{partial}")
    stdout().print(table)


@syncer_app.command("serve", context_settings=FORWARD, add_help_option=False)
def serve(ctx: typer.Context) -> None:
    """Run the synchronizer service (same flags as python -m ddctl_agents.service; --help lists them)."""
    from ddctl_agents.service import server

    raise typer.Exit(server.main(list(ctx.args)))


@syncer_app.command("relay", context_settings=FORWARD, add_help_option=False)
def relay(ctx: typer.Context) -> None:
    """Run a region's relay: each version enters the region once (same flags as python -m ddctl_agents.relay)."""
    from ddctl_agents.relay import serve as relay_serve

    raise typer.Exit(relay_serve.main(list(ctx.args)))


@learner_app.command("run", context_settings=FORWARD, add_help_option=False)
def learner_run(ctx: typer.Context) -> None:
    """Run one learner (same flags as python -m ddctl_agents.agent; --help lists them)."""
    from ddctl_agents.agent.run import main

    raise typer.Exit(main(list(ctx.args)))


def shard_clients(
    job_dir: Path | None, syncer: list[str] | None, run: str
) -> tuple[Path, list[str], Callable[[str], SyncerClient]]:
    """The job directory, every shard's URL (checked), and how to reach one with the admin token: given, or a run's."""
    from ddctl.control.rundir import RunDir
    from ddctl.control.syncer_admin import admin_connector, checked_urls

    if run and (job_dir is not None or syncer):
        raise typer.BadParameter("give JOB_DIR with every shard's --syncer, or --run RUN, not both")
    if run:
        rundir = RunDir(run)
        if not rundir.shard_urls.is_file():
            raise DdctlError(f"run {run} has no sharded synchronizer here (no {rundir.shard_urls}); is it a sharded run?")
        job_dir, syncer = rundir.job, rundir.urls()
    if job_dir is None or not syncer:
        raise typer.BadParameter("give the job directory and every shard's --syncer URL, or --run RUN")
    urls = checked_urls(syncer, "--syncer")
    return job_dir, urls, admin_connector(job_dir)
