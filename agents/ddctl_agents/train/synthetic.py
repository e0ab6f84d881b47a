"""An inner loop that does not train: each step takes a set time and moves every parameter a little.

``ddctl bench wan`` plays many learners on two cores. What it measures is the
synchronizer and the links (the schedule, the ledgers, the bytes each update and
version moves), not the model, so a learner there replaces forward and backward
with a wait of ``seconds`` and a fixed drift per step. Everything else is the real
learner: its schedule, cadence, counters, codecs and HTTP/2 comms. The drift is a
fixed random direction scaled by the step's learning rate, well inside what the
syncer's admission allows of an AdamW step (``core/admission.py``), so its updates
are admitted and merged like any other and their int4 frames are the usual size.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn

from ddctl_agents.train.config import InnerConfig
from ddctl_agents.train.data import BatchSampler
from ddctl_agents.train.inner import InnerTrainer, Placement

DRIFT_OF_LR = 0.25
"""Each step moves a parameter by at most this fraction of the learning rate (AdamW moves it by about lr)."""


class SyntheticTrainer(InnerTrainer):
    """See the module docstring."""

    def __init__(
        self, model: nn.Module, inner: InnerConfig, sampler: BatchSampler, placement: Placement, seconds: float, stream: int
    ) -> None:
        if not seconds > 0:
            raise ValueError(f"a synthetic step takes > 0 seconds, got {seconds}")
        super().__init__(model, inner, sampler, placement)
        self.seconds = seconds
        generator = torch.Generator().manual_seed(inner.seed * 1009 + stream)
        self.direction = {
            name: (torch.rand(p.shape, generator=generator) * 2 - 1).to(p.device) for name, p in self.params.items()
        }
        self._loss = torch.zeros((), device=self.device)

    @torch.no_grad()
    def step(self, step: int, lr: float) -> Tensor:
        """Wait out the step's time, drifting every parameter by ``DRIFT_OF_LR·lr`` along its direction."""
        deadline = time.perf_counter() + self.seconds
        for name, param in self.params.items():
            param.add_(self.direction[name], alpha=DRIFT_OF_LR * lr)
        time.sleep(max(deadline - time.perf_counter(), 0.0))
        return self._loss


__all__ = ["DRIFT_OF_LR", "SyntheticTrainer"]
