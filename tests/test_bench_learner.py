"""``ddctl bench learner``: its figures are what they claim, and bad requests are refused before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddctl_agents.train.config import InnerConfig, ModelConfig
from ddctl_agents.train.data import BatchSampler
from ddctl_agents.train.inner import InnerTrainer, Placement
from ddctl_agents.train.model import build_model
from tests.service_harness import ENV

ROOT = Path(__file__).resolve().parents[1]


def _ddctl(*args: str) -> subprocess.CompletedProcess[str]:
    ddctl = Path(sys.executable).parent / "ddctl"  # the console script, as a user runs it
    return subprocess.run([str(ddctl), *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_bench_learner_reports_true_figures_for_one_and_two_ranks() -> None:
    done = _ddctl("bench", "learner", "--ranks", "1,2", "--steps", "3", "--blocks", "1", "--warmup", "1", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)  # stdout is the result alone: the ranks' chatter goes to stderr
    assert result["preset"] == "tiny" and result["flops_per_token"] > 0
    one, two = result["runs"]
    tokens_per_step = 8 * 128
    for run in (one, two):
        assert run["accelerator"] == "cpu" and run["mfu"] is None  # no bf16 peak for a CPU
        assert run["tokens_per_s"] == pytest.approx(tokens_per_step / run["step_s_without_sync"], rel=1e-4)
        assert run["sync_cost"] == pytest.approx(run["step_s_with_sync"] / run["step_s_without_sync"] - 1, abs=1e-3)
        assert run["updates"] >= 8 and run["bytes_up"] > 0  # the timed loop really sent outer gradients
    assert (one["ranks"], two["ranks"]) == (1, 2)
    assert one["speedup_over_one_rank"] == 1.0
    assert two["speedup_over_one_rank"] == pytest.approx(two["tokens_per_s"] / one["tokens_per_s"], rel=1e-2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ranks", "1,x"], "--ranks must be comma-separated integers in [1, 64], got '1,x'"),
        (["--ranks", "0"], "--ranks must be comma-separated integers in [1, 64], got '0'"),
        (["--ranks", "3"], "--batch 8 must split evenly over every rank count in '3'"),
        (["--blocks", "0"], "--steps and --blocks must be >= 1 and --warmup >= 0, got 16, 0 and 5"),
        (["--device", "cuda"], "--device cuda, but torch sees no CUDA device"),
        (["--preset", "huge"], "preset must be one of"),
    ],
)
def test_bench_learner_refuses_a_bad_request_with_the_reason(args: list[str], message: str) -> None:
    done = _ddctl("bench", "learner", *args)
    assert done.returncode == 2 and message in done.stderr and done.stdout == "", done.stderr


@pytest.mark.slow
def test_a_compiled_learner_takes_the_steps_an_eager_one_takes() -> None:
    """--compile changes how the step runs, not what it computes (fp32 on a CPU; tolerance for fused kernels).

    A one-block model keeps the compilation short; the trainer and its wrapping are the learner's own.
    """
    config = ModelConfig(seq_len=32, d_model=32, n_layer=1, n_head=2)
    data = torch.randint(0, 256, (8192,), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    sampler = BatchSampler(data, 4, config.seq_len, seed=0, stream=0)
    initial = {n: p.detach().clone() for n, p in build_model(config, seed=0).named_parameters()}
    eager = InnerTrainer(build_model(config, seed=0), InnerConfig(), sampler, Placement())
    compiled = InnerTrainer(build_model(config, seed=0), InnerConfig(), sampler, Placement(compile=True))
    assert compiled.forward is not compiled.module  # really wrapped
    for trainer in (eager, compiled):
        for step in range(3):
            loss = trainer.step(step, 1e-3)
    assert torch.isfinite(loss)
    difference = max((eager.params[n] - compiled.params[n]).abs().max().item() for n in initial)
    moved = max((eager.params[n] - initial[n]).abs().max().item() for n in initial)
    assert difference < 1e-4 < moved, (difference, moved)


def test_the_gpu_check_says_in_one_json_line_why_it_cannot_run_here() -> None:
    done = subprocess.run([str(ROOT / "scripts" / "gpu-check")], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stdout + done.stderr
    assert json.loads(lines[0]) == {"ok": False, "error": "torch sees no CUDA device"}
