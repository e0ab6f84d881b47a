"""The ranks of one logical learner: torch.distributed under torchrun, one rank per GPU.

The synchronizer sees one learner; inside it, rank 0 (the leader) talks to the
synchronizer and the others follow. Every rank must take the same decisions on
the same step (adopt these fragment versions, stop), so the leader publishes
them with an asynchronous broadcast launched at the start of a step and read at
its end: it travels while the step computes, never as an extra blocking round
trip. Decisions go over a small gloo group on the host even when the gradients
go over NCCL, so reading one is never a device synchronisation.
"""

from __future__ import annotations

import datetime
import gc
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ddctl_agents.errors import ConfigError

COLLECTIVE_TIMEOUT_S = 600.0
"""A rank waiting longer than this on its peers (one died or hung) fails instead of hanging."""


@dataclass(frozen=True, slots=True)
class Ranks:
    """Where this process sits among the learner's ranks (torchrun's environment)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> Ranks:
        """RANK, WORLD_SIZE and LOCAL_RANK as torchrun sets them; one rank when they are absent."""
        try:
            ranks = cls(
                int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_RANK", "0"))
            )
        except ValueError as exc:
            raise ConfigError(f"RANK, WORLD_SIZE and LOCAL_RANK must be integers: {exc}") from None
        if not (ranks.world >= 1 and 0 <= ranks.rank < ranks.world and ranks.local_rank >= 0):
            raise ConfigError(f"inconsistent torchrun environment: rank {ranks.rank} of {ranks.world}")
        return ranks


class Decisions:
    """The leader's per-step decisions, broadcast to every rank (see the module docstring).

    A decision is a list of at most ``capacity`` integers; with one rank it is
    returned as given, so a single-GPU learner runs the very same loop.
    """

    def __init__(self, ranks: Ranks, capacity: int, group: dist.ProcessGroup | None = None) -> None:
        self.ranks, self.capacity, self.group = ranks, capacity, group
        self._buffer = torch.zeros(capacity + 1, dtype=torch.int64)
        self._work: dist.Work | None = None

    def start(self, decision: Sequence[int] | None) -> None:
        """Leader: publish ``decision``; others: start receiving it (``decision`` is ignored)."""
        if self.ranks.leader:
            values = list(decision or ())
            if len(values) > self.capacity:
                raise ValueError(f"a decision holds at most {self.capacity} integers, got {len(values)}")
            self._buffer.zero_()
            self._buffer[0] = len(values)
            self._buffer[1 : 1 + len(values)] = torch.tensor(values, dtype=torch.int64)
        if self.ranks.world > 1:
            self._work = dist.broadcast(self._buffer, src=0, group=self.group, async_op=True)

    def result(self) -> list[int]:
        """The decision started last, once it has arrived."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        n = int(self._buffer[0])
        return [int(v) for v in self._buffer[1 : 1 + n]]


def share_text(ranks: Ranks, text: str | None, group: dist.ProcessGroup | None = None) -> str:
    """The leader's ``text`` on every rank (once, at start-up: the job and where training starts)."""
    if ranks.world == 1:
        return text or ""
    data = (
        torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)
        if ranks.leader and text
        else torch.empty(0, dtype=torch.uint8)
    )
    size = torch.tensor([data.numel()], dtype=torch.int64)
    dist.broadcast(size, src=0, group=group)
    if not ranks.leader:
        data = torch.empty(int(size), dtype=torch.uint8)
    dist.broadcast(data, src=0, group=group)
    return data.numpy().tobytes().decode() if not ranks.leader else text or ""


def join(ranks: Ranks, device: torch.device) -> dist.ProcessGroup | None:
    """Join the learner's process group (NCCL on GPUs, gloo on CPUs); returns the host group for decisions."""
    if ranks.world == 1:
        return None
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
    return dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None


def leave(ranks: Ranks) -> None:
    """Leave the process group once nothing of this rank's (a DDP module in a reference cycle) still holds it."""
    if ranks.world > 1 and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


__all__ = ["COLLECTIVE_TIMEOUT_S", "Decisions", "Ranks", "join", "leave", "share_text"]
