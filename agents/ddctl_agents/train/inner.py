"""The inner loop of one learner on its device and ranks: the model, its AdamW, one step.

One rank trains the plain module; several ranks of one learner train it with
DDP (every rank holds the whole model) or, with ``shard``, FSDP2 (``fully_shard``
per block where the model has ``blocks``, else as one unit: each rank holds a shard). Either way the learner's batch is split
across the ranks, so N ranks with b/N rows each take the step one rank takes
with b rows.

The outer machinery reads and writes whole fragments through ``read`` and
``write``: the leader sees full values, the other ranks take part in the
collectives (an FSDP gather on read, a broadcast or scatter on write) and are
otherwise idle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddctl_agents.errors import ConfigError
from ddctl_agents.train.config import InnerConfig
from ddctl_agents.train.data import BatchSampler
from ddctl_agents.train.device import autocast, configure_math
from ddctl_agents.train.hostcopy import HostCopier, Snapshot
from ddctl_agents.train.optim import build_inner_optimizer, inner_step, steps_within_memory
from ddctl_agents.train.ranks import Ranks


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where and how one learner's inner loop runs."""

    device: torch.device = torch.device("cpu")
    ranks: Ranks = Ranks()
    shard: bool = False
    """FSDP2 instead of DDP across ranks: for a model that does not fit one device."""
    compile: bool = False
    """torch.compile the forward and backward (minutes of compilation, then faster steps)."""


def _shard(model: nn.Module) -> None:
    """FSDP2 per block of ``model.blocks`` (the contract's optional ModuleList), then the rest as one unit."""
    from torch.distributed.fsdp import fully_shard

    blocks = getattr(model, "blocks", None)
    for block in blocks if isinstance(blocks, nn.ModuleList) else ():
        fully_shard(block)
    fully_shard(model)


class InnerTrainer:
    """See the module docstring."""

    def __init__(self, model: nn.Module, inner: InnerConfig, sampler: BatchSampler, placement: Placement) -> None:
        ranks = placement.ranks
        if sampler.batch_size % ranks.world:
            raise ConfigError(f"batch_size {sampler.batch_size} does not split over {ranks.world} ranks; make it a multiple")
        self.inner, self.sampler, self.placement = inner, sampler, placement
        self.device, self.ranks = placement.device, ranks
        self.copier = HostCopier(self.device)
        configure_math(self.device)
        model.to(self.device)
        self.sharded = placement.shard and ranks.world > 1
        if self.sharded:
            _shard(model)
        self.module = model
        self.params: dict[str, Tensor] = dict(model.named_parameters())
        forward: nn.Module = model
        if ranks.world > 1 and not self.sharded:
            from torch.nn.parallel import DistributedDataParallel

            unused = bool(getattr(model, "unused_parameters", ()))  # the contract lets a model leave some out of a step
            forward = DistributedDataParallel(model, init_sync=False, find_unused_parameters=unused)  # same seeded model
        self.forward = cast(nn.Module, torch.compile(forward)) if placement.compile else forward
        self.optimizer = build_inner_optimizer(model, inner, fused=self.device.type == "cuda")
        self.rows = sampler.batch_size // ranks.world

    @property
    def leader(self) -> bool:
        return self.ranks.leader

    def step(self, step: int, lr: float) -> Tensor:
        """One inner step on this rank's rows of the learner's batch; the loss stays on the device."""
        with steps_within_memory(self.sampler.batch_size, self.sampler.seq_len, self.device):
            x, y = self.sampler.batch(step)
            if self.ranks.world > 1:
                rows = slice(self.ranks.rank * self.rows, (self.ranks.rank + 1) * self.rows)
                x, y = x[rows], y[rows]
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with autocast(self.device):
                return inner_step(self.forward, self.optimizer, x, y, lr, self.inner.grad_clip)

    def read(self, names: Sequence[str]) -> Snapshot | None:
        """Start copying the named parameters' full values to the host: the leader's snapshot, None elsewhere."""
        if self.sharded:
            full = {name: self.params[name].full_tensor() for name in names}  # type: ignore[attr-defined]
            return self.copier.to_host(full) if self.leader else None
        return self.copier.to_host({name: self.params[name] for name in names}) if self.leader else None

    @torch.no_grad()
    def write(self, values: Mapping[str, Tensor | None]) -> None:
        """Overwrite parameters with the leader's host ``values`` (other ranks pass None per name)."""
        for name, host in values.items():
            param = self.params[name]
            if self.sharded:
                self._write_shard(param, host)
                continue
            if host is not None:
                self.copier.to_device(host, param)
            if self.ranks.world > 1:
                dist.broadcast(param.data, src=0)

    def _write_shard(self, param: Tensor, host: Tensor | None) -> None:
        from torch.distributed.tensor import DTensor, distribute_tensor

        assert isinstance(param, DTensor)
        full = torch.empty(param.shape, dtype=param.dtype, device=self.device)
        if host is not None:
            self.copier.to_device(host, full)
        mine = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=0)
        param.to_local().copy_(mine.to_local())

    def loss_mean(self, loss: Tensor) -> float:
        """The learner's training loss over all ranks (a collective and a host sync: call it at log intervals)."""
        if self.ranks.world > 1:
            loss = loss.detach().clone()
            dist.all_reduce(loss)
            loss /= self.ranks.world
        return float(loss)


__all__ = ["InnerTrainer", "Placement"]
