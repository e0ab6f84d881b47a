"""``ddctl bench syncer``: both paths publish the same fragment, and every figure is what it claims."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddctl.bench.rounds import measure_shard_scaling, measure_syncer
from ddctl_agents.core import _native
from tests.service_harness import ENV

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(_native.kernels() is None, reason=f"native kernels missing: {_native.missing_reason()}")
def test_the_fused_and_reference_rounds_agree_and_their_figures_follow_from_the_times() -> None:
    params = 4 * 5000  # 5,000 per tensor: whole tiles and a partial one
    r = measure_syncer(learners=3, numel=params, tensors=4, repeats=2)
    assert r["path"] == "fused"
    assert r["largest_difference"] < 1e-6  # the same fragment, to float32 rounding (values ~1e-3 after a step)
    gb = params * 4 / 1e9
    assert r["merge_gbps"] == pytest.approx(gb / r["round_seconds"], rel=0.01)
    assert r["reference"]["merge_gbps"] == pytest.approx(gb / r["reference"]["round_seconds"], rel=0.01)
    assert r["fused_speedup"] == pytest.approx(r["reference"]["round_seconds"] / r["round_seconds"], rel=0.02)
    assert r["ratio_to_memcpy"] == pytest.approx(r["merge_gbps"] / r["memcpy_gbps"], rel=0.02)
    assert r["decode_seconds"] + r["merge_seconds"] == pytest.approx(r["round_seconds"], rel=0.05)


def test_shard_scaling_runs_each_shard_in_its_own_process() -> None:
    r = measure_shard_scaling(2, learners=2, numel=2 * 4096, tensors=2, rounds=2)
    one, two = r["shards"]
    assert (one["shards"], two["shards"], one["x_one_shard"]) == (1, 2, 1.0)
    gb = 2 * 4096 * 4 / 1e9
    for row in (one, two):
        assert row["aggregate_gbps"] == pytest.approx(row["shards"] * 2 * gb / row["wall_seconds"], rel=0.02)
    assert two["x_one_shard"] == pytest.approx(two["aggregate_gbps"] / one["aggregate_gbps"], rel=0.02)


def test_bench_syncer_refuses_bad_sizes_with_what_is_allowed() -> None:
    ddctl = Path(sys.executable).parent / "ddctl"
    done = subprocess.run(
        [str(ddctl), "bench", "syncer", "--learners", "0", "--json"],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode != 0 and "learners >= 1" in done.stderr + done.stdout
