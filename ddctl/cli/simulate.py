"""``ddctl simulate``: goodput of Decoupled DiLoCo against data-parallel training, for planning."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from ddctl.cli.errors import run_guarded
from ddctl.cli.output import print_json, progress_bar, stdout
from ddctl.errors import SimError
from ddctl.goodput.params import SimParams

D = SimParams()
"""The mechanisms' defaults live in SimParams alone; the flags show them."""


def simulate(
    chips: Annotated[str, typer.Option(help="Chips in the whole job: 150k, 1.2m, 4096 ...")] = "1.2m",
    learners: Annotated[int, typer.Option(min=1, help="M: Decoupled learners the chips are split into.")] = 8,
    mtbi: Annotated[str, typer.Option(help="Per-chip mean time between interruptions: 1y, 6mo, 90d, 3600 (s).")] = "1y",
    seeds: Annotated[int, typer.Option(min=1, max=100, help="Seeds per cell (95% intervals over them).")] = 5,
    days: Annotated[float, typer.Option(min=0.01, max=3650, help="Simulated days per run.")] = D.days,
    grid: Annotated[bool, typer.Option("--grid", help="The paper's table: every system at 150k..2.4M chips.")] = False,
    sensitivity: Annotated[
        bool, typer.Option("--sensitivity", help="Goodput as MTBI (0.5, 1, 2 y) and repair times (x0.25, x1, x4) move.")
    ] = False,
    plot: Annotated[Path | None, typer.Option(help="Also draw the result as a PNG chart here.")] = None,
    tape: Annotated[
        Path | None, typer.Option(help="Write the Decoupled learners' availability (seed 0) as an event tape here.")
    ] = None,
    tape_seconds: Annotated[
        float, typer.Option(min=1.0, max=31_536_000, help="How much of the timeline the tape covers.")
    ] = 600.0,
    slice_chips: Annotated[int, typer.Option(min=1, help="Chips per slice (what an elastic job drops).")] = D.slice_chips,
    notice: Annotated[
        float, typer.Option(min=0.0, help="Seconds an interruption is announced before its chip goes down.")
    ] = D.notice_s,
    restart: Annotated[float, typer.Option(min=0.0, help="Non-elastic DP: seconds to restart the whole job.")] = D.restart_s,
    downscale: Annotated[
        float, typer.Option(min=0.0, help="Elastic: seconds of whole-unit pause to drop slices ...")
    ] = D.downscale_s,
    downscale_per_slice: Annotated[
        float, typer.Option(min=0.0, help="... plus this much per slice dropped.")
    ] = D.downscale_per_slice_s,
    upscale: Annotated[float, typer.Option(min=0.0, help="Elastic: seconds of pause to add repaired slices back.")] = D.upscale_s,
    upscale_wait: Annotated[
        float, typer.Option(min=0.0, help="A repaired slice waits this long for a reconfiguration to ride along.")
    ] = D.upscale_wait_s,
    repair_scale: Annotated[
        float, typer.Option(min=0.001, help="Repair time (exp. Weibull): scale, seconds.")
    ] = D.repair_scale_s,
    repair_shape: Annotated[float, typer.Option(min=0.001, help="Repair time: shape k (< 1 is heavy-tailed).")] = D.repair_shape,
    repair_power: Annotated[float, typer.Option(min=0.001, help="Repair time: exponent a.")] = D.repair_power,
    jitter: Annotated[
        float, typer.Option(min=0.0, help="Per-slice step-time CV; synchronous steps wait for the slowest.")
    ] = D.jitter,
    fetch: Annotated[
        float, typer.Option(min=0.0, help="Decoupled: seconds a learner that lost every slice bootstraps.")
    ] = D.fetch_s,
    quorum: Annotated[int, typer.Option(min=1, help="K: learners that must train for the global model to advance.")] = D.quorum,
    jobs: Annotated[int, typer.Option(min=0, help="Worker processes (0: one per core).")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Simulate goodput and uptime under chip failures: data-parallel (plain and elastic) and Decoupled DiLoCo.

    One cell: ddctl simulate --chips 1.2m --learners 8. The paper's table: ddctl simulate --grid.
    """
    from ddctl.goodput.params import parse_chips, parse_duration

    def body() -> dict[str, Any]:
        if plot is not None:
            check_plot_path(plot, sensitivity)
        p = SimParams(
            mtbi_s=parse_duration(mtbi),
            slice_chips=slice_chips,
            notice_s=notice,
            restart_s=restart,
            downscale_s=downscale,
            downscale_per_slice_s=downscale_per_slice,
            upscale_s=upscale,
            upscale_wait_s=upscale_wait,
            repair_scale_s=repair_scale,
            repair_shape=repair_shape,
            repair_power=repair_power,
            jitter=jitter,
            fetch_s=fetch,
            quorum=quorum,
            days=days,
        )
        workers = jobs or None
        if grid:
            from ddctl.goodput.grid import grid as run_grid

            with progress_bar("simulating the grid", 1) as update:
                result = run_grid(p, seeds, workers)
                update(1, 1)
        elif sensitivity:
            from ddctl.goodput.grid import sensitivity as run_sensitivity

            result = run_sensitivity(parse_chips(chips), learners, p, seeds, workers)
        else:
            result = _one_cell(parse_chips(chips), learners, p, seeds, workers)
        if tape is not None:
            from ddctl.goodput.system import simulate_cell
            from ddctl.goodput.timeline import write_tape

            cell = simulate_cell(f"decoupled_m{learners}", parse_chips(chips), p, 0)
            result["tape"] = {"path": str(tape), "outages": write_tape(tape, cell, p, tape_seconds), "seconds": tape_seconds}
        if plot is not None and not sensitivity:
            from ddctl.goodput.plot import plot_cell, plot_grid

            (plot_grid if grid else plot_cell)(result, plot)
            result["plot"] = str(plot)
        return result

    result = run_guarded(body)
    if json_out:
        print_json(result)
    elif grid:
        _print_grid(result)
    elif sensitivity:
        _print_sensitivity(result)
    else:
        _print_cell(result)


def check_plot_path(plot: Path, sensitivity: bool) -> None:
    """Before any simulating: a chart that cannot be drawn where asked fails now, not after the run and its tape."""
    if sensitivity:
        raise SimError("--plot draws one cell or the grid; --sensitivity has no chart (drop one of them)")
    if plot.suffix.lower() != ".png" or plot.is_dir():
        raise SimError(f"--plot {plot}: give a file name ending in .png")
    if not plot.parent.is_dir():
        raise SimError(f"--plot {plot}: the folder {plot.parent} does not exist")


def _one_cell(chips: int, learners: int, p: SimParams, seeds: int, jobs: int | None) -> dict[str, Any]:
    from ddctl.goodput.grid import run_cells

    systems = ["dp", "elastic_dp", f"decoupled_m{learners}"]
    cells = run_cells(((s, chips) for s in systems), p, seeds, jobs)
    return {
        "chips": chips,
        "learners": learners,
        "mtbi_s": p.mtbi_s,
        "seeds": seeds,
        "days": p.days,
        "params": asdict(p),
        "systems": {
            c.system: {
                "goodput": c.goodput.mean,
                "goodput_ci95": c.goodput.ci95,
                "uptime": c.uptime.mean,
                "uptime_ci95": c.uptime.ci95,
                "lost": c.lost,
                "interruptions": c.interruptions,
            }
            for c in cells
        },
    }


def _print_cell(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{result['chips']:,} chips, {result['seeds']} seeds x {result['days']:g} days (% of chip-time)")
    for col in ("system", "goodput", "uptime", "reconfiguring", "repair", "straggler", "blocked"):
        table.add_column(col, justify="right" if col != "system" else "left")
    for name, s in result["systems"].items():
        lost = [f"{s['lost'][k]:.2f}" for k in ("reconfiguring", "repair", "straggler", "blocked")]
        table.add_row(name, _with_interval(s["goodput"], s["goodput_ci95"]), _with_interval(s["uptime"], s["uptime_ci95"]), *lost)
    stdout().print(table)
    _print_extras(result)


def _with_interval(value: float, ci95: float) -> str:
    """``value ± ci95``; one seed has no interval (NaN), shown as a dash, not "nan"."""
    return f"{value:.1f} ± {ci95:.1f}" if math.isfinite(ci95) else f"{value:.1f} ± -"


def _print_grid(result: dict[str, Any]) -> None:
    from rich.table import Table

    columns = list(next(iter(result["goodput"].values())))
    table = Table(title=f"goodput % (paper), {result['seeds']} seeds x {result['days']:g} days; uptime % after /")
    table.add_column("system")
    for chips in columns:
        table.add_column(f"{int(chips) / 1e6:g}M", justify="right")
    for system, row in result["goodput"].items():
        cells = [f"{row[c]:.1f} ({result['paper'][system][c]}) / {result['uptime'][system][c]:.0f}" for c in columns]
        table.add_row(system, *cells)
    stdout().print(table)
    typer.echo(
        f"largest |simulated - paper|: {result['max_abs_error']:.1f} points "
        f"({result['max_abs_error_predicted']:.1f} on the predicted Decoupled rows; calibrated on dp, elastic_dp)"
    )
    _print_extras(result)


def _print_sensitivity(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"goodput % at {result['chips']:,} chips as MTBI and repair times move ({result['seeds']} seeds)")
    for col in ("MTBI (years)", "mean repair (min)", *result["systems"]):
        table.add_column(col, justify="right")
    for row in result["rows"]:
        table.add_row(f"{row['mtbi_years']:g}", f"{row['repair_mean_s'] / 60:.0f}", *(f"{row[s]:.1f}" for s in result["systems"]))
    stdout().print(table)


def _print_extras(result: dict[str, Any]) -> None:
    if "tape" in result:
        typer.echo(f"tape: {result['tape']['outages']} learner outages in {result['tape']['path']}")
    if "plot" in result:
        typer.echo(f"chart: {result['plot']}")
