"""``ddctl bench ladder``: Decoupled DiLoCo against data-parallel at an honest budget, rung by rung.

A comparison at one token per parameter (the 1M-token quality benchmark on the
tiny preset) says little about what a user gets: compute-optimal training is
about twenty. Each rung here is a model size trained for ``TOKENS_PER_PARAM``
tokens per parameter, data-parallel with M = 4 and Decoupled with M = 2, 4, 8,
on the same data and evaluation, with the same per-learner batch. The finding is
the Decoupled / DP ratio of val_bpb per rung and whether it falls with scale.
Rungs run on this machine's CPU (the virtual cluster and the DP baseline train
there); the GPU rungs of issue 18 (small, base) need a CUDA virtual cluster,
which does not exist yet, and are refused with that reason.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddctl.bench.quality import job_config, measure
from ddctl_agents.errors import ConfigError

TOKENS_PER_PARAM = 20
"""About compute-optimal (Hoffmann et al., 2022)."""
RUNGS = ("micro", "mini", "tiny")
"""Presets that make a rung, smallest first: all train on a CPU."""
GPU_RUNGS = ("small", "base")
ARMS: dict[str, tuple[bool, int]] = {
    "dp_m4": (True, 4),
    "decoupled_m2": (False, 2),
    "decoupled_m4": (False, 4),
    "decoupled_m8": (False, 8),
}
"""Arm -> (data-parallel, M)."""
BASELINE = "dp_m4"


@dataclass(frozen=True, slots=True)
class Run:
    rung: str
    arm: str
    seed: int
    tokens: int


def parameters(preset: str) -> int:
    """The preset's parameter count, from the model itself."""
    from ddctl_agents.train.model import build_model, count_parameters
    from ddctl_agents.train.presets import get_preset

    return count_parameters(build_model(get_preset(preset), seed=0))


def plan(rungs: Sequence[str], seeds: Sequence[int], arms: Sequence[str], tokens_per_param: float) -> list[Run]:
    """Every (rung, arm, seed), largest work last; refuses unknown names and GPU rungs with what is allowed."""
    gpu = [r for r in rungs if r in GPU_RUNGS]
    if gpu:
        raise ConfigError(
            f"rung {', '.join(gpu)} needs a GPU, and the virtual cluster and DP baseline train on the CPU only; "
            f"allowed here: {', '.join(RUNGS)}"
        )
    unknown = [r for r in rungs if r not in RUNGS] + [a for a in arms if a not in ARMS]
    if unknown:
        raise ConfigError(f"unknown {', '.join(unknown)}; rungs: {', '.join(RUNGS)}; arms: {', '.join(ARMS)}")
    if not rungs or not seeds or not arms:
        raise ConfigError("the ladder needs at least one rung, one seed and one arm")
    if not 0 < tokens_per_param <= 1000:
        raise ConfigError(f"tokens per parameter must be in (0, 1000], got {tokens_per_param:g}")
    budget = {r: round(tokens_per_param * parameters(r)) for r in rungs}
    return [Run(r, a, s, budget[r]) for r in rungs for s in seeds for a in arms]


def run_one(run: Run) -> dict[str, Any]:
    data_parallel, learners = ARMS[run.arm]
    row = measure(job_config(run.tokens, learners=learners, preset=run.rung, seed=run.seed), data_parallel=data_parallel)
    return {"rung": run.rung, "arm": run.arm, "seed": run.seed, **row}


def summarize(rows: Sequence[dict[str, Any]], params: dict[str, int]) -> dict[str, Any]:
    """Per rung and arm: mean and spread over seeds; each Decoupled arm over DP; the trend across rungs."""
    rungs: dict[str, Any] = {}
    for rung in sorted({r["rung"] for r in rows}, key=lambda name: params[name]):
        arms: dict[str, Any] = {}
        for arm in ARMS:
            mine = [r for r in rows if r["rung"] == rung and r["arm"] == arm]
            if not mine:
                continue
            bpb = [r["val_bpb"] for r in mine]
            arms[arm] = {
                "seeds": len(mine),
                "val_bpb": statistics.fmean(bpb),
                "val_bpb_stdev": statistics.stdev(bpb) if len(bpb) > 1 else None,
                "bytes_per_token": statistics.fmean(r["bytes_per_token"] for r in mine),
                "wall_s": statistics.fmean(r["wall_s"] for r in mine),
            }
        dp = arms.get(BASELINE)
        for arm, stats in arms.items():
            if dp is not None and arm != BASELINE:
                stats["val_bpb_over_dp"] = stats["val_bpb"] / dp["val_bpb"]
                stats["dp_bytes_per_token_over_this"] = dp["bytes_per_token"] / stats["bytes_per_token"]
        rungs[rung] = {"params": params[rung], "tokens": next(r["tokens"] for r in rows if r["rung"] == rung), "arms": arms}
    ratios = [(name, rung["arms"].get("decoupled_m4", {}).get("val_bpb_over_dp")) for name, rung in rungs.items()]
    measured = [(name, ratio) for name, ratio in ratios if ratio is not None]
    falls = None if len(measured) < 2 else all(b[1] < a[1] for a, b in zip(measured, measured[1:], strict=False))
    return {"rungs": rungs, "m4_over_dp_by_rung": dict(measured), "m4_ratio_falls_with_scale": falls}


def run_ladder(
    rungs: Sequence[str],
    seeds: Sequence[int],
    arms: Sequence[str] = tuple(ARMS),
    tokens_per_param: float = TOKENS_PER_PARAM,
    jobs: int = 1,
    out: Path | None = None,
) -> dict[str, Any]:
    """Run the plan, writing the result after every run so a long ladder never loses what it measured."""
    runs = plan(rungs, seeds, arms, tokens_per_param)
    params = {r: parameters(r) for r in rungs}
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {}

    def record(row: dict[str, Any]) -> None:
        nonlocal result
        rows.append(row)
        ordered = sorted(rows, key=lambda r: (params[r["rung"]], r["arm"], r["seed"]))
        result = {"tokens_per_param": tokens_per_param, "runs": ordered, **summarize(ordered, params)}
        if out is not None:
            out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")

    if jobs > 1:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for future in as_completed([pool.submit(run_one, run) for run in runs]):
                record(future.result())
    else:
        for run in runs:
            record(run_one(run))
    return result


__all__ = ["ARMS", "RUNGS", "TOKENS_PER_PARAM", "plan", "run_ladder", "summarize"]
