"""``ddctl up``, ``status`` and ``down``: a run's lifecycle from the laptop."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ddctl.cli.errors import EXIT_DATA, EXIT_UNREACHABLE, run_guarded
from ddctl.cli.output import print_json, stdout
from ddctl.cli.selection import JsonOption, RunOption, on_run

if TYPE_CHECKING:
    from ddctl.control.state import State

RegionsOption = Annotated[Path, typer.Option("-f", "--file", help="The regions file.")]


def up(
    file: RegionsOption = Path("regions.yaml"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Play every region on this machine.")] = False,
    plan_only: Annotated[bool, typer.Option("--plan", help="Print what up would do and its $/h; change nothing.")] = False,
    follow: Annotated[bool, typer.Option("--follow", help="Stay attached and show the run's status until Ctrl-C.")] = False,
    keep: Annotated[bool, typer.Option("--keep", help="When the job finishes, keep its machines until `ddctl down`.")] = False,
    resume_from: Annotated[
        str,
        typer.Option(
            "--resume-from", help="Start a new run from a checkpoint: DIR, s3://B/P or gs://B/P (a folder: its newest)."
        ),
    ] = "",
    json_out: JsonOption = False,
) -> None:
    """Bring the run of the regions file up, or converge it if it runs (nothing twice); returns once it trains."""
    from ddctl.cli.output import progress_lines
    from ddctl.config.regions import load_regions
    from ddctl.control.state import State
    from ddctl.control.up import plan_actions, up

    def say(text: str) -> None:
        typer.echo(text, err=True)

    def body() -> dict[str, Any]:
        rf = load_regions(file)
        if plan_only:  # read only: a plan reads the state file where there is one and makes none
            with State() if State.default_path().is_file() else nullcontext(None) as state:
                plan = plan_actions(rf, dry_run=dry_run, say=say, state=state)
            if resume_from:  # checked as up would check it (whole, and against this job's model), so a plan says so
                from ddctl.config.regions import job_config
                from ddctl.control.pull import resume_point

                plan["resume_from"] = resume_point(resume_from, job_config(rf).inner)[1]
            return plan
        with State() as state, progress_lines(f"bringing {rf.run} up") as progress:  # a spinner on a terminal
            return up(rf, state, dry_run=dry_run, keep=keep, resume_from=resume_from, say=progress)

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
    for col in ("instance", "region", "provider", "role", "gpus", "type", "spot", "max $/h", "up would"):
        table.add_column(col)
    for i in result["instances"]:
        price = "-" if i["max_dollars_per_hour"] is None else f"{i['max_dollars_per_hour']:.2f}"
        ranks = str(result["gpus"][i["region"]]) if i["role"] == "learner" else "-"  # ranks per learner
        role = f"{i['role']} + relay" if i.get("relay") == "host" else i["role"]  # it runs its region's relay too
        where = (i["name"], i["region"], i["provider"], role, ranks)
        table.add_row(*where, i["instance_type"] or "-", str(i["spot"]), price, i["action"])
    stdout().print(table)
    if result.get("synchronizer"):
        _print_shards(result["synchronizer"])
    if "cost" in result:
        _print_money(result)
    if resumed := result.get("resume_from"):
        typer.echo(f"resumes from {resumed['from']}: checkpoint {resumed['checkpoint']} of run {resumed['run']}, "
                   f"{resumed['rounds']} rounds, val_bpb {resumed['val_bpb']}")  # fmt: skip
    unpriced = f" (no price cap in: {', '.join(result['unpriced'])})" if result["unpriced"] else ""
    typer.echo(f"at most ${result['max_dollars_per_hour']:.2f}/h{unpriced}; nothing was changed")


def _print_shards(plan: dict[str, Any]) -> None:
    """Per region: its link (declared or assumed), cadence, relay, shards and the predicted link load."""
    from rich.table import Table

    table = Table(title=f"synchronizer: {len(plan['shards'])} shard(s); predicted link load per region (priors)")
    for col in (
        "region",
        "learners",
        "link Mbit/s up/down",
        "step s",
        "cadence",
        "relay",
        "shards",
        "out Mbit/s",
        "in Mbit/s",
        "load",
        "own",
    ):
        table.add_column(col)
    for r in plan["sites"]:
        link = f"{r['link_mbps'][0]:g}/{r['link_mbps'][1]:g}" + (" (assumed)" if r["link"] == "assumed" else "")
        shards = ",".join(map(str, r["shards"])) or "-"
        numbers = (f"{r['egress_mbps']:.3f}", f"{r['ingress_mbps']:.3f}", f"{r['utilisation']:.1%}", f"{r['floor']:.1%}")
        table.add_row(
            r["region"],
            str(r["learners"]),
            link,
            f"{r['step_s']:.3g}",
            f"every {r['cadence']}",
            str(r["relay"]).lower(),
            shards,
            *numbers,
        )
    stdout().print(table)
    typer.echo(
        f"busiest link {plan['utilisation']:.1%} of its capacity (bound {plan['bound']:.1%}); busiest shard site "
        f"{plan['over_bound']:.3f}x its bound; 'own': a region's load from its learners alone, which no placement moves"
    )


def _print_money(result: dict[str, Any]) -> None:
    """Per region: the type and zone chosen, spot $/h beside on-demand, egress; then warnings, totals, assumptions."""
    from rich.table import Table

    def usd(value: float | None) -> str:
        return "unknown" if value is None else f"{value:.4f}"

    if all(r["spot_per_hour"] == 0 and r["egress_per_hour"] == 0 and not r["warnings"] for r in result["regions"]):
        # every region runs on this machine: nothing to pay, only what the traffic would be
        for note in result["cost"]["notes"]:
            typer.echo(f"note: {note}")
        return
    table = Table(title="what it costs (USD per instance-hour; egress per region-hour)")
    for col in ("region", "n", "type", "zone", "spot $/h", "on-demand $/h", "egress GB/h", "egress $/h"):
        table.add_column(col)
    for r in result["regions"]:
        row = (r["instance_type"] or "-", r["zone"] or "-", usd(r["spot_per_hour"]), usd(r["on_demand_per_hour"]))
        table.add_row(r["region"], str(r["instances"]), *row, f"{r['egress_gb_per_hour']:.3f}", usd(r["egress_per_hour"]))
    stdout().print(table)
    for r in result["regions"]:
        for warning in r["warnings"]:
            typer.echo(f"warning: {r['region']}: {warning}")
    cost = result["cost"]
    unknown = f" (unknown, left out: {', '.join(cost['unknown'])})" if cost["unknown"] else ""
    typer.echo(
        f"expected ${cost['total_dollars_per_hour']:.2f}/h: instances ${cost['dollars_per_hour']:.2f}/h "
        f"(on demand ${cost['on_demand_dollars_per_hour']:.2f}/h) + egress ${cost['egress_dollars_per_hour']:.2f}/h{unknown}"
    )
    for pair in cost["egress_by_cloud"]:
        if pair["from"] != pair["to"]:
            typer.echo(
                f"egress {pair['from']} -> {pair['to']}: {pair['gb_per_hour']:.3f} GB/h, ${usd(pair['dollars_per_hour'])}/h"
            )
    for note in cost["notes"]:
        typer.echo(f"note: {note}")


def status(
    run: RunOption = "",
    watch: Annotated[bool, typer.Option("--watch", help="A live dashboard, redrawn in place until Ctrl-C.")] = False,
    every: Annotated[float, typer.Option(min=0.2, help="Seconds between questions to the syncer.")] = 1.0,
    json_out: JsonOption = False,
) -> None:
    """The run at a glance: learners with their links, the job's rounds and books, and recent events.

    Exit code 6 when the syncer of an unfinished job cannot be reached, 3 when its answer is not a status (the snapshot
    still shows what ddctl knows)."""
    from ddctl.dashboard.render import render
    from ddctl.dashboard.watch import snapshot
    from ddctl.dashboard.watch import watch as live

    if watch and not json_out:

        def follow(r: str, state: State) -> None:
            live(r, state, stdout(), every_s=every)

        on_run(run, follow)
        return
    result = on_run(run, snapshot)
    if json_out:
        print_json(result)
    else:
        console = stdout()
        console.print(render(result, console.width, 10_000))
    if not result["syncer"]["reachable"] and result["job"]["phase"] != "finished":
        raise typer.Exit(EXIT_DATA if result["syncer"]["unusable"] else EXIT_UNREACHABLE)


def down(
    run: RunOption = "",
    purge: Annotated[bool, typer.Option("--purge", help="Then delete ended runs' local directories (as `ddctl gc`).")] = False,
    orphans: Annotated[
        bool, typer.Option("--orphans", help="Instead: remove what dead or expired runs left in the file's cloud regions.")
    ] = False,
    regions_file: RegionsOption = Path("regions.yaml"),
    json_out: JsonOption = False,
) -> None:
    """Stop and remove every machine of the run (found by its labels); with nothing running, does nothing (exit 0)."""
    from ddctl.cli.catalog import printed_purge
    from ddctl.control.down import down as run_down
    from ddctl.control.down import report
    from ddctl.control.runs import LIVE, choose_run
    from ddctl.control.runs import purge as purge_runs
    from ddctl.control.state import State

    def body() -> dict[str, Any]:
        if orphans:
            from ddctl.config.regions import load_regions
            from ddctl.control.down import sweep_orphans

            rf = load_regions(regions_file)
            with State() as state:
                return sweep_orphans(rf, state, time.time())
        with State() as state:
            idle = not run and not any(r.state in LIVE for r in state.runs())
            # a named run is searched by its labels even if this machine has no record of it (the state file is a cache)
            result = {"run": None, "removed": {}} if idle else run_down(run or choose_run(state), state)
            if purge:
                result["purged"] = purge_runs(state)
            return result

    result = run_guarded(body)
    if json_out:
        print_json(result)
        return
    typer.echo(report(result) if result["run"] else "nothing is running: nothing to remove")
    if purge:
        printed_purge(result["purged"])


def stop(
    run: RunOption = "",
    reason: Annotated[str, typer.Option(help="Why, for the record (in the summary and the events).")] = "stopped by the operator",
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds to wait for the result.")] = 600.0,
    json_out: JsonOption = False,
) -> None:
    """End the job now: learners push their last drift, the syncer writes the result, the machines go (unless --keep)."""
    from ddctl.control.finish import stop as stop_job

    result = on_run(run, lambda r, state: stop_job(r, state, reason, timeout))
    if json_out:
        print_json(result)
    else:
        typer.echo(finished_line(result["run"], result["summary"]))


def finished_line(run: str, summary: dict[str, Any]) -> str:
    tokens = summary["tokens"]
    cost = "" if summary.get("dollars") is None else f", ${summary['dollars']:.2f}"
    return (
        f"{run} finished ({summary['reason']}): val_bpb {summary['val_bpb']}, {tokens['merged']:,} of "
        f"{tokens['trained']:,} trained tokens merged in {summary['rounds']} rounds{cost}; result in {summary['result']}"
    )
