"""``ddctl ls`` and ``ddctl gc``: the runs this machine knows, and removing what ended runs left behind."""

from __future__ import annotations

from typing import Any

import typer

from ddctl.cli.errors import run_guarded
from ddctl.cli.output import print_json, stdout
from ddctl.cli.selection import JsonOption


def ls(json_out: JsonOption = False) -> None:
    """List runs: state, regions, machines up (from the providers' labels), age, and money at the plan's rate: $/h
    (egress included, 0 once ended) and $ so far; ddctl status prices the machines on the bill now."""
    from dataclasses import asdict

    from ddctl.control.runs import list_runs
    from ddctl.control.state import State

    def body() -> list[dict[str, Any]]:
        with State() as state:
            return [asdict(row) for row in list_runs(state)]

    rows = run_guarded(body)
    if json_out:
        print_json({"runs": rows})
        return
    if not rows:
        typer.echo("no runs yet; start one with: ddctl up --dry-run")
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col, justify in (("run", "left"), ("state", "left"), ("regions", "left"), ("up", "right"), ("age", "right"),
                         ("plan $/h", "right"), ("$ so far", "right")):  # fmt: skip
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(
            r["run"], r["state"], ",".join(r["regions"]), str(r["instances_up"]), age(r["age_s"]),
            money(r["dollars_per_hour"]), money(r["dollars_so_far"]),
        )  # fmt: skip
    stdout().print(table)


def gc(json_out: JsonOption = False) -> None:
    """Delete the local directories (keys, secrets, logs, final snapshots) of ended runs; live runs are untouched."""
    from ddctl.control.runs import purge
    from ddctl.control.state import State

    def body() -> dict[str, Any]:
        with State() as state:
            return purge(state)

    result = run_guarded(body)
    if json_out:
        print_json(result)
    else:
        printed_purge(result)


def printed_purge(result: dict[str, Any]) -> None:
    """What ``gc`` (or ``down --purge``) deleted, one line each, and the space it freed."""
    for item in result["removed"]:
        typer.echo(f"deleted {item['path']} ({item['bytes'] / 1e6:.1f} MB)")
    typer.echo(f"freed {result['bytes'] / 1e6:.1f} MB" if result["removed"] else "no ended run left anything to delete")


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def money(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
