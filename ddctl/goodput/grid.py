"""Many cells at once: seeds, confidence intervals, the paper's table, a sensitivity sweep.

Cells are independent, so they run in worker processes (one per core); each
is deterministic for its (system, chips, seed), so the answer does not depend
on how the work was split.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from ddctl.goodput.params import GRID_CHIPS, YEAR_S, SimParams, grid_systems, learners_of
from ddctl.goodput.system import simulate_cell

PAPER_GOODPUT: dict[str, tuple[int, ...]] = {
    "dp": (72, 57, 38, 27, 18),
    "elastic_dp": (88, 80, 69, 58, 40),
    "decoupled_m2": (94, 88, 80, 70, 54),
    "decoupled_m4": (96, 93, 89, 82, 73),
    "decoupled_m8": (98, 96, 94, 88, 80),
    "decoupled_m16": (99, 98, 96, 93, 86),
}
"""ALGORITHM.md §8: goodput in percent at 150k, 300k, 600k, 1.2M and 2.4M chips, MTBI one year."""
CALIBRATED_ON = ("dp", "elastic_dp")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


@dataclass(frozen=True, slots=True)
class Estimate:
    """Mean over seeds, in percent, with the half-width of its 95% confidence interval (Student t)."""

    mean: float
    ci95: float

    @staticmethod
    def of(values: list[float]) -> Estimate:
        mean = statistics.fmean(values)
        if len(values) < 2:
            return Estimate(round(mean, 2), math.nan)
        t = T_975.get(len(values) - 1, 1.96)
        return Estimate(round(mean, 2), round(t * statistics.stdev(values) / math.sqrt(len(values)), 2))


@dataclass(frozen=True, slots=True)
class CellSummary:
    system: str
    chips: int
    goodput: Estimate
    uptime: Estimate
    lost: dict[str, float]
    """Percent of allocated chip-time lost, by cause (mean over seeds)."""
    interruptions: float


def _cell(args: tuple[str, int, SimParams, int]) -> tuple[str, int, float, float, dict[str, float], int]:
    system, chips, p, seed = args
    run = simulate_cell(system, chips, p, seed)
    lost = {k: 100 * v / run.allocated for k, v in run.lost.items()}
    return system, chips, 100 * run.goodput, 100 * run.uptime, lost, run.failures


def run_cells(cells: Iterable[tuple[str, int]], p: SimParams, seeds: int, jobs: int | None = None) -> list[CellSummary]:
    """Every (system, chips) cell over ``seeds`` seeds, in parallel; results in the order given."""
    cells = list(cells)
    for system, _ in cells:
        learners_of(system)  # refuse an unknown system before any work starts
    tasks = [(system, chips, p, seed) for system, chips in cells for seed in range(seeds)]
    workers = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    if workers == 1:
        results = list(map(_cell, tasks))
    else:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_cell, tasks, chunksize=max(1, len(tasks) // (4 * workers))))
    out = []
    for system, chips in cells:
        mine = [r for r in results if r[0] == system and r[1] == chips]
        out.append(
            CellSummary(
                system,
                chips,
                Estimate.of([r[2] for r in mine]),
                Estimate.of([r[3] for r in mine]),
                {k: round(statistics.fmean(r[4][k] for r in mine), 3) for k in mine[0][4]},
                statistics.fmean(r[5] for r in mine),
            )
        )
    return out


def grid(p: SimParams, seeds: int, jobs: int | None = None) -> dict[str, Any]:
    """The paper's table: systems x 150k..2.4M chips, as ``{"goodput": {system: {chips: %}}, "uptime": ...}``."""
    cells = run_cells(((s, c) for s in grid_systems() for c in GRID_CHIPS), p, seeds, jobs)
    by = {(c.system, c.chips): c for c in cells}
    table: dict[str, Any] = {key: {} for key in ("goodput", "uptime", "goodput_ci95", "uptime_ci95", "paper", "error")}
    for system in grid_systems():
        for k, chips in enumerate(GRID_CHIPS):
            cell, col = by[(system, chips)], str(chips)
            table["goodput"].setdefault(system, {})[col] = cell.goodput.mean
            table["uptime"].setdefault(system, {})[col] = cell.uptime.mean
            table["goodput_ci95"].setdefault(system, {})[col] = cell.goodput.ci95
            table["uptime_ci95"].setdefault(system, {})[col] = cell.uptime.ci95
            table["paper"].setdefault(system, {})[col] = PAPER_GOODPUT[system][k]
            table["error"].setdefault(system, {})[col] = round(cell.goodput.mean - PAPER_GOODPUT[system][k], 2)
    predicted = [abs(v) for s, row in table["error"].items() if s not in CALIBRATED_ON for v in row.values()]
    return {
        **table,
        "seeds": seeds,
        "days": p.days,
        "params": asdict(p),
        "calibrated_on": list(CALIBRATED_ON),
        "max_abs_error": max(abs(v) for row in table["error"].values() for v in row.values()),
        "max_abs_error_predicted": max(predicted),
    }


MTBI_YEARS = (0.5, 1.0, 2.0)
REPAIR_SCALES = (0.25, 1.0, 4.0)


def sensitivity(chips: int, learners: int, p: SimParams, seeds: int, jobs: int | None = None) -> dict[str, Any]:
    """Goodput of elastic DP and Decoupled (M learners) as MTBI and repair times move, at ``chips`` chips."""
    systems = ("elastic_dp", f"decoupled_m{learners}")
    rows = []
    for years in MTBI_YEARS:
        for scale in REPAIR_SCALES:
            q = replace(p, mtbi_s=years * YEAR_S, repair_scale_s=p.repair_scale_s * scale)
            cells = run_cells(((s, chips) for s in systems), q, seeds, jobs)
            rows.append(
                {
                    "mtbi_years": years,
                    "repair_mean_s": round(q.mean_repair_s(), 1),
                    **{c.system: c.goodput.mean for c in cells},
                }
            )
    return {"chips": chips, "learners": learners, "seeds": seeds, "systems": list(systems), "rows": rows}
