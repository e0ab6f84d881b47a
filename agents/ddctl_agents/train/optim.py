"""The inner optimiser: AdamW, its learning-rate schedule, and one training step."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ddctl_agents.errors import OutOfMemory
from ddctl_agents.train.config import InnerConfig, require
from ddctl_agents.train.contract import training_loss
from ddctl_agents.train.model import POSITION_EMBEDDING


def inner_lr(step: int, total_steps: int, config: InnerConfig) -> float:
    """Linear warm-up to config.lr, then cosine decay to min_lr_ratio * lr at the last step.

    step counts from 0; steps at or past total_steps - 1 stay on the floor.
    """
    require(step >= 0, f"step must be >= 0, got {step}")
    require(total_steps >= 1, f"total_steps must be >= 1, got {total_steps}")
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    floor = config.min_lr_ratio * config.lr
    decay_steps = max(1, total_steps - 1 - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / decay_steps)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.lr - floor)


def _decays(name: str, param: Tensor) -> bool:
    """Weight decay only for matrices: not LayerNorm gains, biases or positional embeddings."""
    return param.ndim >= 2 and not name.endswith(POSITION_EMBEDDING)


def build_inner_optimizer(model: nn.Module, config: InnerConfig, *, fused: bool = False) -> torch.optim.AdamW:
    """AdamW with two parameter groups (decay / no decay), in the model's parameter order.

    ``fused`` (for CUDA) updates every parameter in one kernel: the same arithmetic, a fraction of the launches.
    """
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if _decays(n, p)], "weight_decay": config.weight_decay},
        {"params": [p for n, p in named if not _decays(n, p)], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, fused=fused or None)


def inner_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: Tensor,
    y: Tensor,
    lr: float,
    grad_clip: float,
) -> Tensor:
    """One forward/backward/clip/update; returns the detached training loss.

    The loss stays a device tensor so a GPU loop has no host sync: call .item()
    only when logging. grad_clip 0 disables clipping.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = training_loss(model(x, y))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.detach()


def _out_of_memory(exc: BaseException) -> bool:
    """The allocator's refusal: CUDA's has its own type, the CPU's is a RuntimeError that says so."""
    return isinstance(exc, torch.OutOfMemoryError | MemoryError) or "can't allocate memory" in str(exc)


@contextmanager
def steps_within_memory(batch_size: int, seq_len: int, device: torch.device) -> Iterator[None]:
    """Inner steps whose batch does not fit in memory end in OutOfMemory naming the settings to change, not in the
    allocator's traceback from deep inside the step."""
    try:
        yield
    except (RuntimeError, MemoryError) as exc:
        if not _out_of_memory(exc):
            raise
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise OutOfMemory(
            f"an inner step of batch_size {batch_size} sequences of {seq_len} tokens does not fit in the {device.type} "
            f"memory ({said}); lower batch_size (--batch-size, training.batch_size) or pick a smaller preset"
        ) from None


__all__ = ["build_inner_optimizer", "inner_lr", "inner_step", "steps_within_memory"]
