from __future__ import annotations

import pytest
import torch

from builders import small_run
from ddctl.config.train import ClusterConfig, Outage
from ddctl.local.training import train_decoupled
from ddctl_agents.errors import OutOfMemory
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.optim import steps_within_memory


@pytest.fixture(scope="module")
def baseline_run() -> dict:
    return train_decoupled(small_run(tokens=60_000))


def test_validation_loss_falls(baseline_run: dict) -> None:
    untrained = Assembly.build(small_run()).evaluate(Assembly.build(small_run()).initial)
    assert untrained > 7.5  # a byte model at initialisation is near uniform (8 bits)
    assert baseline_run["val_bpb"] < untrained - 2.0


def test_result_has_the_promised_keys_and_consistent_counts(baseline_run: dict) -> None:
    for key in ("val_bpb", "tokens", "bytes_up", "bytes_down", "wall_s", "params_sha256"):
        assert key in baseline_run
    assert baseline_run["tokens"] >= 60_000
    assert baseline_run["bytes_up"] > 0 and baseline_run["bytes_down"] > 0
    assert baseline_run["rounds"] > 0
    assert baseline_run["ledger"]["balanced"], baseline_run["ledger"]


def test_the_same_config_gives_the_same_parameters(baseline_run: dict) -> None:
    again = train_decoupled(small_run(tokens=60_000))
    assert again["params_sha256"] == baseline_run["params_sha256"]
    other_seed = train_decoupled(small_run(tokens=20_000))
    assert other_seed["params_sha256"] != baseline_run["params_sha256"]


def test_int4_moves_far_fewer_bytes_than_fp32() -> None:
    int4 = train_decoupled(small_run(tokens=20_000, codec="int4"))
    fp32 = train_decoupled(small_run(tokens=20_000, codec="fp32"))
    assert fp32["bytes_up"] / int4["bytes_up"] > 5


@pytest.mark.slow
def test_a_failed_learner_costs_only_its_own_tokens_and_rejoins() -> None:
    cluster = ClusterConfig(outages=(Outage(learner=1, at=5.0, duration=8.0),))
    run = train_decoupled(small_run(tokens=60_000, learners=3, cluster=cluster))
    ledger = run["ledger"]
    assert ledger["balanced"], ledger
    assert ledger["lost_at_failure"] > 0
    assert ledger["merged"] + ledger["late_merged"] > 0.8 * ledger["trained"]


def test_the_mixture_of_experts_model_trains_through_the_same_path() -> None:
    run = train_decoupled(small_run(tokens=16_000, preset="tiny-moe"))
    assert run["params"] > 2_000_000  # four experts per layer
    assert run["val_bpb"] < 7.0 and run["ledger"]["balanced"]


def test_only_the_allocators_refusal_becomes_out_of_memory_naming_the_settings() -> None:
    refused = "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"
    said = r"batch_size 7 sequences of 128 tokens does not fit in the cpu memory \(\[enf"
    with pytest.raises(OutOfMemory, match=said), steps_within_memory(7, 128, torch.device("cpu")):
        raise RuntimeError(refused)
    cuda = torch.device("cuda")
    with pytest.raises(OutOfMemory, match="in the cuda memory .*lower batch_size"), steps_within_memory(7, 128, cuda):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    other = pytest.raises(RuntimeError, match="^shapes do not match$")  # any other error is left as it is
    with other, steps_within_memory(7, 128, torch.device("cpu")):
        raise RuntimeError("shapes do not match")
