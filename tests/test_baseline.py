"""The synchronous data-parallel baseline with real torch.distributed (gloo, DDP),
plus the evaluation and checksum helpers it reports with."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ddctl.errors import WorkerError
from ddctl.local.baseline import ring_allreduce_bytes, run_data_parallel
from ddctl_agents.train.checksum import params_sha256
from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget
from ddctl_agents.train.data import load_corpus, validation_batches
from ddctl_agents.train.evaluate import evaluate_bpb
from ddctl_agents.train.model import build_model, count_parameters
from ddctl_agents.train.presets import get_preset

INNER = InnerConfig(preset="tiny", batch_size=8, warmup_steps=5, seed=3)
DATA = DataConfig(max_bytes=1 << 20, eval_windows=16)
TINY = get_preset("tiny")
STEPS = 20


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, Any]:
    budget = RunBudget(tokens=STEPS * 2 * INNER.batch_size * TINY.seq_len, learners=2)
    return run_data_parallel(INNER, DATA, budget, 1, timeout_s=300, keep_params=True)


@pytest.fixture(scope="module")
def val_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    corpus = load_corpus(DATA)
    return validation_batches(corpus.val, TINY.seq_len, DATA.eval_windows, INNER.batch_size)


def test_two_ranks_learn(two_ranks: dict[str, Any], val_batches: list[Any]) -> None:
    untrained = evaluate_bpb(build_model(TINY, INNER.seed), val_batches)
    assert math.isfinite(two_ranks["val_bpb"])
    assert two_ranks["val_bpb"] < untrained - 1.0
    assert two_ranks["steps"] == STEPS and two_ranks["learners"] == 2
    assert two_ranks["tokens"] == STEPS * 2 * INNER.batch_size * TINY.seq_len
    assert [step for step, _ in two_ranks["loss_curve"]] == [0, 10, 19]
    assert two_ranks["wall_s"] > two_ranks["train_s"] > 0


def test_bytes_follow_the_ring_all_reduce_formula(two_ranks: dict[str, Any]) -> None:
    gradient_bytes = 4 * count_parameters(build_model(TINY, 0))  # float32, every step
    per_rank = 2 * (2 - 1) / 2 * gradient_bytes * STEPS
    assert two_ranks["bytes_up"] == two_ranks["bytes_down"] == 2 * per_rank


def test_ranks_end_identical_and_params_are_the_evaluated_ones(two_ranks: dict[str, Any], val_batches: list[Any]) -> None:
    rank0, rank1 = two_ranks["rank_params_sha256"]
    assert rank0 == rank1 == two_ranks["params_sha256"] == params_sha256(two_ranks["params"])
    initial = build_model(TINY, INNER.seed)
    assert params_sha256(dict(initial.named_parameters())) != rank0
    initial.load_state_dict(two_ranks["params"])
    assert evaluate_bpb(initial, val_batches) == pytest.approx(two_ranks["val_bpb"], rel=1e-6)


def test_one_rank_needs_no_group_and_moves_no_bytes() -> None:
    budget = RunBudget(tokens=3 * INNER.batch_size * TINY.seq_len, learners=1)
    result = run_data_parallel(INNER, DATA, budget, timeout_s=300)
    assert result["bytes_up"] == result["bytes_down"] == 0
    assert result["steps"] == 3 and result["learners"] == 1
    assert math.isfinite(result["val_bpb"]) and "params" not in result


def test_worker_failure_surfaces_with_its_traceback(tmp_path: Path) -> None:
    data = DataConfig(paths=(tmp_path / "missing",))
    with pytest.raises(WorkerError, match=r"(?s)rank \d failed:.*Traceback.*ConfigError.*missing"):
        run_data_parallel(INNER, data, RunBudget(tokens=10_000, learners=2), timeout_s=300)


def test_ring_allreduce_bytes() -> None:
    assert ring_allreduce_bytes(1000, 1) == 0
    assert ring_allreduce_bytes(1000, 2) == 1000
    assert ring_allreduce_bytes(1000, 4) == 1500


def test_evaluate_bpb_is_token_weighted_cross_entropy_in_bits(val_batches: list[Any]) -> None:
    model = build_model(TINY, seed=0)
    (x, y), (x2, y2) = val_batches[0], val_batches[1]
    batches = [(x, y), (x2[:3], y2[:3])]  # unequal sizes: a plain mean of batch means would differ
    with torch.no_grad():
        logits = model(torch.cat([x, x2[:3]])).logits
    nats = F.cross_entropy(logits.flatten(0, 1), torch.cat([y, y2[:3]]).flatten()).item()
    bpb = evaluate_bpb(model, batches)
    assert bpb == pytest.approx(nats / math.log(2), rel=1e-5)
    assert 7.5 < bpb < 8.1  # untrained: about log2(256) bits per byte
    assert model.training
    model.eval()
    evaluate_bpb(model, batches)
    assert not model.training


def test_params_sha256_depends_on_values_and_names_order_only() -> None:
    a = {"b": torch.tensor([1.0, 2.0]), "a": torch.tensor([[0.5]])}
    same = {"a": torch.tensor([[0.5]], dtype=torch.bfloat16), "b": torch.tensor([1.0, 2.0])}
    assert params_sha256(a) == params_sha256(same)
    assert params_sha256(a) != params_sha256({"a": a["a"], "b": torch.tensor([1.0, 2.5])})
    assert params_sha256(a) != params_sha256({"z": a["a"], "b": a["b"]})  # order by name changes
