"""One cell of the table: a system of N chips under one seed's failures.

Failures are drawn once per (chips, seed) for the whole machine and shared by
every system of the cell (common random numbers): data-parallel runs them on
one unit of N chips, Decoupled DiLoCo on M learners of N/M chips. Goodput is
useful chip-time over allocated chip-time; uptime is the time in which the
global model advances (the job runs; for Decoupled, at least K learners train,
else the training learners block and their time is lost as ``blocked``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ddctl.errors import SimError
from ddctl.goodput.params import SimParams, learners_of
from ddctl.goodput.unit import LOSSES, UnitRun, simulate_unit


@dataclass(frozen=True, slots=True)
class CellRun:
    system: str
    chips: int
    seed: int
    goodput: float
    uptime: float
    allocated: float
    """Chip-seconds allocated (chips x horizon)."""
    useful: float
    lost: dict[str, float]
    failures: int
    units: tuple[UnitRun, ...]


def draw_failures(chips: int, p: SimParams, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, chip ids, repair durations) of every failure over the horizon: Poisson, uniform over chips."""
    rng = np.random.default_rng([seed, chips])
    count = rng.poisson(chips * p.horizon_s / p.mtbi_s)
    times = np.sort(rng.uniform(0.0, p.horizon_s, count))
    chip_ids = rng.integers(0, chips, count)
    u = rng.random(count)
    repairs = p.repair_scale_s * (-np.log1p(-(u ** (1 / p.repair_power)))) ** (1 / p.repair_shape)
    return times, chip_ids, repairs


def simulate_cell(system: str, chips: int, p: SimParams, seed: int) -> CellRun:
    learners = learners_of(system)
    if learners > chips:
        raise SimError(f"{system} needs at least {learners} chips, got {chips}")
    quorum = p.quorum if system.startswith("decoupled") else 1  # data-parallel is one unit: it runs or it does not
    if quorum > learners:
        raise SimError(f"quorum must be between 1 and the learners ({learners}) of {system}, got {p.quorum}")
    times, chip_ids, repairs = draw_failures(chips, p, seed)
    bounds = np.linspace(0, chips, learners + 1).round().astype(np.int64)
    unit_of = np.searchsorted(bounds, chip_ids, side="right") - 1
    units = []
    for u in range(learners):
        mine = unit_of == u
        size = int(bounds[u + 1] - bounds[u])
        slices = max(1, math.ceil(size / p.slice_chips))
        slice_of = (chip_ids[mine] - bounds[u]) * slices // size
        units.append(
            simulate_unit(
                size,
                slices,
                times[mine].tolist(),
                slice_of.tolist(),
                repairs[mine].tolist(),
                p,
                elastic=system != "dp",
                fetch_s=p.fetch_s if system.startswith("decoupled") else 0.0,
            )
        )
    allocated = chips * p.horizon_s
    up_s, blocked = _quorum(units, quorum, p.horizon_s)
    lost = {k: sum(u.lost[k] for u in units) for k in LOSSES}
    lost["blocked"] = blocked
    useful = sum(u.useful for u in units) - blocked
    return CellRun(system, chips, seed, useful / allocated, up_s / p.horizon_s, allocated, useful, lost, len(times), tuple(units))


def _quorum(units: list[UnitRun], quorum: int, horizon: float) -> tuple[float, float]:
    """(seconds with at least ``quorum`` units training, useful chip-seconds lost to blocking below it)."""
    starts = np.concatenate([np.asarray(u.seg_start, dtype=float) for u in units])
    ends = np.concatenate([np.asarray(u.seg_end, dtype=float) for u in units])
    rates = np.concatenate([np.asarray(u.seg_useful, dtype=float) for u in units])
    if starts.size == 0:
        return 0.0, 0.0
    at = np.concatenate([[0.0], starts, ends])
    count = np.concatenate([[0], np.ones_like(starts, dtype=np.int64), -np.ones_like(ends, dtype=np.int64)])
    rate = np.concatenate([[0.0], rates, -rates])
    order = np.argsort(at, kind="stable")
    at, running, useful_rate = at[order], np.cumsum(count[order]), np.cumsum(rate[order])
    span = np.diff(np.append(at, horizon))
    up = float(span[running >= quorum].sum())
    blocked = float((span * useful_rate)[running < quorum].sum()) if quorum > 1 else 0.0
    return up, max(blocked, 0.0)
