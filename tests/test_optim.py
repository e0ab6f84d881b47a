"""Inner learning-rate schedule, AdamW parameter groups, and one training step."""

from __future__ import annotations

import itertools

import pytest
import torch

from ddctl_agents.train.config import ConfigError, InnerConfig, ModelConfig
from ddctl_agents.train.model import build_model
from ddctl_agents.train.optim import build_inner_optimizer, inner_lr, inner_step

CONFIG = InnerConfig(lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
SMALL = ModelConfig(seq_len=16, d_model=32, n_layer=2, n_head=4)


def test_warmup_is_linear_up_to_the_peak() -> None:
    lrs = [inner_lr(step, 100, CONFIG) for step in range(10)]
    assert lrs == pytest.approx([1e-4 * (i + 1) for i in range(10)])
    assert inner_lr(10, 100, CONFIG) == pytest.approx(1e-3)


def test_cosine_decays_to_the_floor_at_the_last_step_and_stays() -> None:
    lrs = [inner_lr(step, 100, CONFIG) for step in range(10, 100)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))
    assert lrs[-1] == pytest.approx(1e-4)
    assert inner_lr(500, 100, CONFIG) == pytest.approx(1e-4)
    midpoint = 10 + (99 - 10) / 2
    assert inner_lr(int(midpoint), 100, CONFIG) == pytest.approx(5.5e-4, rel=0.02)


def test_no_warmup_starts_at_the_peak() -> None:
    assert inner_lr(0, 50, InnerConfig(lr=2e-3, warmup_steps=0)) == pytest.approx(2e-3)
    with pytest.raises(ConfigError, match="step"):
        inner_lr(-1, 50, CONFIG)


def test_weight_decay_only_on_matrices_not_position_embedding() -> None:
    model = build_model(SMALL, seed=0)
    decay, no_decay = build_inner_optimizer(model, InnerConfig(weight_decay=0.1)).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    exempt = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert decayed.isdisjoint(exempt) and decayed | exempt == set(names.values())
    assert {"wte.weight", "blocks.0.attn.qkv.weight", "blocks.1.ffn.fc.weight"} <= decayed
    assert {"wpe.weight", "ln_f.weight", "blocks.0.attn.qkv.bias"} <= exempt


def test_inner_step_learns_and_clips_without_syncing() -> None:
    model = build_model(SMALL, seed=0)
    optimizer = build_inner_optimizer(model, InnerConfig())
    x = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))
    y = torch.roll(x, -1, dims=1)
    losses = [inner_step(model, optimizer, x, y, lr=3e-3, grad_clip=0.5) for _ in range(15)]
    assert isinstance(losses[0], torch.Tensor) and losses[0].ndim == 0
    assert not losses[0].requires_grad
    assert losses[-1].item() < losses[0].item() - 1.0
    assert all(group["lr"] == 3e-3 for group in optimizer.param_groups)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item() <= 0.5 + 1e-4
