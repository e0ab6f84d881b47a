"""``ddctl bench quality``: Decoupled DiLoCo variants against data-parallel at equal tokens.

Every run trains the same model on the same corpus with the same token budget
and per-learner batch; only the named knobs differ. Quality is validation bits
per byte; traffic is bytes per token, up plus down. The targets of issue 2 are
evaluated on the numbers of this run, never on remembered ones.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from ddctl.config.job import build_job
from ddctl.config.train import ClusterConfig, TrainConfig
from ddctl_agents.errors import ConfigError
from ddctl_agents.train.presets import get_preset

HETEROGENEOUS = (1.0, 1.0, 0.6, 0.6)
"""Two fast and two slow learners (the paper's heterogeneous-hardware setting, halved)."""


def job_config(tokens: int, learners: int = 4, speeds: tuple[float, ...] = (), **knobs: Any) -> TrainConfig:
    """The job's defaults (the same as ``ddctl train``'s) with the run's knobs."""
    config = build_job({"tokens": tokens, "learners": learners, **knobs}, base=TrainConfig())
    return dataclasses.replace(config, cluster=ClusterConfig(speeds=speeds))


RUNS: dict[str, Callable[[int], TrainConfig]] = {
    "dp_m4": lambda t: job_config(t),  # dp_* runs use the data-parallel baseline
    "dp_m2": lambda t: job_config(t, learners=2),
    "dp_m8": lambda t: job_config(t, learners=8),
    "decoupled_m2": lambda t: job_config(t, learners=2),
    "decoupled_m4": lambda t: job_config(t),
    "decoupled_m8": lambda t: job_config(t, learners=8),
    "hetero_k1_nograce": lambda t: job_config(t, speeds=HETEROGENEOUS, grace=False),
    "hetero_k1_grace": lambda t: job_config(t, speeds=HETEROGENEOUS, grace=True),
    "codec_bf16": lambda t: job_config(t, codec="bf16"),
    "codec_int2": lambda t: job_config(t, codec="int2"),
    "codec_int1": lambda t: job_config(t, codec="int1"),
    "merge_mean": lambda t: job_config(t, merge="mean"),
    "merge_mean_m8": lambda t: job_config(t, learners=8, merge="mean"),
    "frag6_balanced": lambda t: job_config(t, fragments=6),
    "frag6_layer": lambda t: job_config(t, fragments=6, fragmentation="layer"),
    "frag4_balanced": lambda t: job_config(t, fragments=4),
    "frag4_layer": lambda t: job_config(t, fragments=4, fragmentation="layer"),
    "outer_diloco": lambda t: job_config(t, outer_lr=0.7, outer_momentum=0.9),
    "outer_average": lambda t: job_config(t, outer_lr=1.0, outer_momentum=0.0),
    "outer_warmup5": lambda t: job_config(t, outer_warmup=5),
    "outer_warmup10": lambda t: job_config(t, outer_warmup=10),
    "hetero_k1_grace_push": lambda t: job_config(t, speeds=HETEROGENEOUS, grace=True, push_before_overwrite=True),
    "h12": lambda t: job_config(t, inner_steps=12, fragments=12),  # H against scale: a fragment per step of the period
    "h48": lambda t: job_config(t, inner_steps=48),
}
"""Name -> config. Unnamed knobs are the defaults: M=4, P=H=24, tau=2, K=1, grace, int4, RDA, balanced."""


def run_one(name: str, tokens: int, preset: str | None = None, seed: int = 0) -> dict[str, Any]:
    config = build_job({"preset": preset, "seed": seed}, base=RUNS[name](tokens))
    return measure(config, data_parallel=name.startswith("dp_"))


def measure(config: TrainConfig, *, data_parallel: bool) -> dict[str, Any]:
    """Train ``config`` (Decoupled, or its data-parallel baseline with the same M) and keep what the benchmarks report."""
    if data_parallel:
        from ddctl.local.baseline import run_data_parallel

        result = run_data_parallel(config.inner, config.data, config.budget, threads_per_rank=1)
    else:
        from ddctl.local.training import train_decoupled

        result = train_decoupled(config)
    keep = ("val_bpb", "tokens", "bytes_up", "bytes_down", "wall_s", "rounds", "ledger", "learners", "restarts")
    row = {k: result[k] for k in keep if k in result}
    row["bytes_per_token"] = (result["bytes_up"] + result["bytes_down"]) / max(result["tokens"], 1)
    row["config"] = {
        "learners": config.budget.learners,
        "codec": config.sync.codec,
        "merge": config.syncer.merge,
        "fragments": config.sync.fragments,
        "fragmentation": config.fragmentation,
        "grace": config.syncer.quorum.grace,
        "speeds": list(config.speeds()),
        "outer": [config.syncer.outer.lr, config.syncer.outer.momentum],
        "outer_warmup": config.syncer.outer.warmup,
        "push_before_overwrite": config.sync.push_before_overwrite,
    }
    return row


def run_quality(
    tokens: int, only: list[str], out: Path | None = None, jobs: int = 1, preset: str | None = None, seeds: Sequence[int] = (0,)
) -> dict[str, Any]:
    """Every named run once per seed; a run's row is its first seed's, with val_bpb the mean over seeds."""
    unknown = [n for n in only if n not in RUNS]
    if unknown:
        raise ConfigError(f"unknown runs {', '.join(unknown)}; allowed: {', '.join(RUNS)}")
    if not seeds:
        raise ConfigError("at least one seed is needed")
    if tokens < 1 or jobs < 1:
        raise ConfigError(f"tokens and jobs must be >= 1, got {tokens} and {jobs}")
    if preset is not None:
        get_preset(preset)  # an unknown one is refused here, not by every run
    names = only or list(RUNS)
    done: dict[str, dict[int, dict[str, Any]]] = {}
    failed: dict[str, str] = {}

    def record(name: str, seed: int, row: dict[str, Any] | BaseException) -> dict[str, Any]:
        """Keep every finished run, and every refused one with its reason: one bad run never costs the others."""
        if isinstance(row, BaseException):
            failed[f"{name}@{seed}"] = f"{type(row).__name__}: {row}"
        else:
            done.setdefault(name, {})[seed] = row
        rows = {n: _over_seeds(done[n], seeds) for n in names if n in done}
        result = {"tokens": tokens, "preset": preset, "seeds": list(seeds), "runs": rows, "targets": evaluate_targets(rows)}
        if failed:
            result["failed"] = dict(failed)
        if out is not None:
            out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        return result

    result: dict[str, Any] = {}
    work = [(name, seed) for seed in seeds for name in names]
    if jobs > 1:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_one, name, tokens, preset, seed): (name, seed) for name, seed in work}
            for future in as_completed(futures):
                result = record(*futures[future], future.exception() or future.result())
    else:
        for name, seed in work:
            try:
                row: dict[str, Any] | BaseException = run_one(name, tokens, preset, seed)
            except Exception as exc:  # noqa: BLE001 - recorded with its reason; the CLI exits non-zero
                row = exc
            result = record(name, seed, row)
    return result


def _over_seeds(by_seed: dict[int, dict[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """The first seed's row, with val_bpb the mean of the seeds run so far, each seed's value and their spread."""
    ran = [s for s in seeds if s in by_seed]
    values = [by_seed[s]["val_bpb"] for s in ran]
    row = dict(by_seed[ran[0]])
    row["val_bpb"] = statistics.fmean(values)
    if len(seeds) > 1:
        row["val_bpb_by_seed"] = dict(zip(map(str, ran), values, strict=True))
        row["val_bpb_stdev"] = statistics.stdev(values) if len(values) > 1 else None
    return row


def evaluate_targets(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Issue 2's targets, each with the two numbers it compares; absent runs give None."""

    def ratio(a: str, b: str, key: str) -> float | None:
        return rows[a][key] / rows[b][key] if a in rows and b in rows else None

    m4_vs_dp = ratio("decoupled_m4", "dp_m4", "val_bpb")
    int4_vs_bf16 = ratio("decoupled_m4", "codec_bf16", "val_bpb")
    traffic = ratio("dp_m4", "decoupled_m4", "bytes_per_token")
    low_bits = [ratio(n, "decoupled_m4", "val_bpb") for n in ("codec_int2", "codec_int1")]
    return {
        "m4_val_bpb_over_dp": m4_vs_dp,
        "m4_within_5pct_of_dp": None if m4_vs_dp is None else m4_vs_dp <= 1.05,
        "int4_val_bpb_over_bf16": int4_vs_bf16,
        "int4_within_1pct_of_bf16": None if int4_vs_bf16 is None else int4_vs_bf16 <= 1.01,
        "int2_int1_val_bpb_over_int4": low_bits,
        "low_bits_worse": None if None in low_bits else all(r > 1.0 for r in low_bits),  # type: ignore[operator]
        "dp_bytes_per_token_over_m4": traffic,
        "traffic_50x_below_dp": None if traffic is None else traffic >= 50,
    }


__all__ = ["RUNS", "evaluate_targets", "job_config", "measure", "run_one", "run_quality"]
