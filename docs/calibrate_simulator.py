"""Calibrate the simulator's mechanisms on the paper's two data-parallel rows: `python docs/calibrate_simulator.py`.

Non-elastic row -> notice and restart time; elastic row -> downscale (fixed and
per slice) and upscale pauses. The objective is the largest |simulated - paper|
over the row's five sizes (2 seeds x 7 days). The Decoupled rows are never
looked at: they are the model's predictions (`ddctl simulate --grid`).
"""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from ddctl.goodput.grid import PAPER_GOODPUT
from ddctl.goodput.params import GRID_CHIPS, SimParams
from ddctl.goodput.system import simulate_cell


def worst(job: tuple[str, dict[str, Any]]) -> tuple[float, dict[str, Any], list[float]]:
    system, knobs = job
    p = SimParams(**knobs)
    got = [sum(100 * simulate_cell(system, c, p, seed).goodput for seed in (0, 1)) / 2 for c in GRID_CHIPS]
    return round(max(abs(g - t) for g, t in zip(got, PAPER_GOODPUT[system], strict=True)), 2), knobs, [round(g, 1) for g in got]


def search(system: str, jobs: list[dict[str, Any]]) -> tuple[float, dict[str, Any], list[float]]:
    with ProcessPoolExecutor() as pool:
        return min(pool.map(worst, [(system, knobs) for knobs in jobs]), key=lambda r: r[0])


def main() -> dict[str, Any]:
    dp = search("dp", [{"notice_s": n, "restart_s": r} for n in (2, 4, 6, 8, 10) for r in range(70, 110, 4)])
    notice = dp[1]["notice_s"]
    elastic = search(
        "elastic_dp",
        [
            {"notice_s": notice, "downscale_s": d, "downscale_per_slice_s": ps, "upscale_s": u}
            for d in (12, 16, 20, 24)
            for ps in (0, 2, 4, 6, 8)
            for u in (0, 2, 5, 10)
        ],
    )
    return {
        "dp": {"max_abs_error": dp[0], "params": dp[1], "goodput": dp[2]},
        "elastic_dp": {"max_abs_error": elastic[0], "params": elastic[1], "goodput": elastic[2]},
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
