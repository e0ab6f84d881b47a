"""Validation quality in bits per byte: the one number every training mode reports."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ddctl_agents.train.contract import quality_loss


def evaluate_bpb(model: nn.Module, batches: list[tuple[Tensor, Tensor]]) -> float:
    """Token-weighted mean cross-entropy over the batches, in bits per byte.

    Uses the pure cross-entropy (``.ce``: no MoE balancing term), runs in eval mode
    without gradients, and restores the model's previous mode. Losses stay on
    the device until one final host sync.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    tokens = 0
    try:
        with torch.no_grad():
            for x, y in batches:
                ce = quality_loss(model(x.to(device), y.to(device)))
                total += ce.double() * y.numel()
                tokens += y.numel()
    finally:
        model.train(was_training)
    if tokens == 0:
        raise ValueError("evaluate_bpb needs at least one non-empty batch")
    return total.item() / tokens / math.log(2)


__all__ = ["evaluate_bpb"]
