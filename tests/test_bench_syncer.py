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


@pytest.mark.usefixtures("native_kernels")
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
    assert r["decode_seconds"] + r["merge_seconds"] == pytest.approx(r["round_seconds"], abs=2e-6)  # one round's split


@pytest.mark.usefixtures("native_kernels")
def test_the_round_says_which_sums_it_ran_on_as_the_cpu_and_the_switch_decide() -> None:
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    best = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "portable"
    assert measure_syncer(learners=2, numel=2048, tensors=2, repeats=1)["int4_sums"] == best
    before = _native.use_avx512(False)
    try:
        assert measure_syncer(learners=2, numel=2048, tensors=2, repeats=1)["int4_sums"] == best.replace("avx512", "avx2")
    finally:
        _native.use_avx512(True if before is None else before)


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


def test_the_syncer_table_shows_the_results_figures() -> None:
    from rich.console import Console

    from ddctl.bench.report import syncer_table

    row = {"merge_gbps": 1.1, "ratio_to_memcpy": 0.07, "round_seconds": 0.031, "decode_seconds": 0.004, "merge_seconds": 0.027}
    reference = {"merge_gbps": 0.37, "ratio_to_memcpy": 0.024, "round_seconds": 0.09, "decode_seconds": 0.02}
    reference["merge_seconds"] = 0.07
    result = {"learners": 8, "params": 1000, "path": "fused", "memcpy_gbps": 15.0, "fused_speedup": 2.9, "reference": reference}
    result["int4_sums"] = "avx2"
    result |= row | {"scaling": {"shards": [{"shards": 2, "aggregate_gbps": 1.4, "x_one_shard": 1.8}]}}
    console = Console(width=200, record=True)
    console.print(syncer_table(result))
    text = console.export_text()
    cells = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]] for line in text.splitlines() if "│" in line}
    assert cells["fused (avx2)"] == ["1.100", "0.0700", "0.031", "0.004", "0.027"]
    assert cells["reference"] == ["0.370", "0.0240", "0.090", "0.020", "0.070"]
    assert "fused 2.90x the reference" in text and "2 shards: 1.400 GB/s (1.80x)" in text
