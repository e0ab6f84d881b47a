"""Device choice and the host-copy machinery, through the very functions a GPU learner uses (their CPU twins)."""

from __future__ import annotations

import pytest
import torch

from builders import small_run
from ddctl_agents.errors import ConfigError
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.device import autocast, describe, resolve_device
from ddctl_agents.train.hostcopy import HostCopier
from ddctl_agents.train.learner import Learner
from ddctl_agents.train.ranks import Decisions, Ranks
from tests.test_learner import bootstrapped


def make_learner() -> Learner:
    return bootstrapped(Assembly.build(small_run()))


def test_auto_is_the_cpu_without_cuda_and_cuda_without_a_gpu_is_refused() -> None:
    assert not torch.cuda.is_available()  # these CI machines have none; the GPU check script covers the other side
    assert resolve_device("auto") == torch.device("cpu") == resolve_device("cpu")
    with pytest.raises(ConfigError, match="--device cuda, but torch sees no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match="device must be one of auto, cuda, cpu; got 'tpu'"):
        resolve_device("tpu")


def test_a_cpu_learner_reports_itself_as_cpu_and_computes_in_fp32() -> None:
    cpu = torch.device("cpu")
    assert describe(cpu).accelerator == "cpu" and describe(cpu).memory_gb == 0.0
    with autocast(cpu):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_a_snapshot_keeps_the_values_of_when_it_was_taken() -> None:
    copier = HostCopier(torch.device("cpu"))
    param = torch.arange(6.0).reshape(2, 3)
    snapshot = copier.to_host({"w": param})
    param.add_(100.0)  # the optimiser moves on before the encoder reads the snapshot
    assert snapshot.ready()
    assert torch.equal(snapshot.wait()["w"], torch.arange(6.0).reshape(2, 3))


def test_an_anchor_is_an_fp32_host_copy_and_to_device_overwrites_in_place() -> None:
    copier = HostCopier(torch.device("cpu"))
    value = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    anchor = copier.anchor(value)
    assert anchor.dtype == torch.float32 and torch.equal(anchor, value.float())
    value.zero_()
    assert anchor.tolist() == [1.5, -2.25]  # a copy, not a view of the network buffer
    target = torch.zeros(1, 2)
    copier.to_device(anchor, target)
    assert target.tolist() == [[1.5, -2.25]]


def test_a_send_measures_drift_at_its_start_even_if_it_finishes_a_step_later() -> None:
    learner = make_learner()
    learner.train_step()
    pending = learner.begin_send(0)
    names = list(pending.snapshot.wait()) if pending.snapshot else []
    at_begin = {name: learner.params[name].detach().clone() for name in names}
    anchor = {name: learner.state[0].ref[name].clone() for name in names}
    learner.train_step()  # the next step runs while the snapshot would be in flight
    update = learner.finish_send(pending)
    assert update is not None and update.step == 1 and update.c_steps == 1
    for name in names:
        assert torch.equal(update.tensors[name], anchor[name] - at_begin[name])
        assert torch.equal(learner.state[0].ref[name], at_begin[name])  # the anchor moved to the snapshot


def test_one_ranks_decision_is_its_own_and_a_too_long_one_is_refused() -> None:
    decisions = Decisions(Ranks(), capacity=5)
    decisions.start([0, 3, 7])
    assert decisions.result() == [0, 3, 7]
    decisions.start(None)
    assert decisions.result() == []
    with pytest.raises(ValueError, match="at most 5 integers, got 6"):
        decisions.start([1] * 6)


def test_an_inconsistent_torchrun_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="inconsistent torchrun environment: rank 2 of 2"):
        Ranks.from_env()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match="must be integers"):
        Ranks.from_env()


def test_a_batch_the_ranks_cannot_split_is_refused() -> None:
    from ddctl_agents.train.inner import InnerTrainer, Placement

    learner = make_learner()
    with pytest.raises(ConfigError, match="batch_size 4 does not split over 3 ranks; make it a multiple"):
        InnerTrainer(learner.trainer.module, learner.inner, learner.trainer.sampler, Placement(ranks=Ranks(0, 3, 0)))
