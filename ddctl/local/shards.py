"""The synchronizer of the virtual cluster and of its replay: one core, or shards that own whole fragments.

A shard is the service's ``ShardSynchronizer``, dealt fragments round robin (``shardmap.round_robin``), exactly
as ``ddctl syncer init --shards N`` deals them. Shards never talk to one another: the cluster routes each
update to its fragment's owner, tells every shard of a join, a heartbeat and a departure (as a learner does
over HTTP), and joins the owners' fragments into the model at the end.
"""

from __future__ import annotations

import dataclasses

import torch

from ddctl_agents.core import vclock
from ddctl_agents.core.ledger import TokenLedger
from ddctl_agents.core.shardmap import ShardMap, ShardRole, round_robin
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.train.assembly import Assembly


class Shards:
    """The job's synchronizer cores (one unless ``cluster.shards`` says more) and which owns each fragment."""

    def __init__(self, assembly: Assembly, n: int | ShardMap = 1, shared_budget: bool = True) -> None:
        """``n`` shards dealt fragments round robin, or the fragments as a shard map deals them (a service's replay).

        ``shared_budget``: the virtual cluster's learners share one token budget, so a fast one trains past its
        share (up to the whole budget), and a learner at cadence k may send all of that drift in one update, which
        the job's per-learner step bound would refuse. A service's learners each train their share: its bound."""
        count = assembly.fragmentation.count
        steps = assembly.config.budget.tokens // (assembly.config.inner.batch_size * assembly.model_config.seq_len) + 1
        whole = steps if shared_budget else None
        if n == 1:
            self.cores: list[Synchronizer] = [assembly.new_syncer(max_steps=whole)]
            self.owners: tuple[int, ...] = (0,) * count
            self.names: tuple[str, ...] = (vclock.SYNCER,)
        else:
            shard_map = n if isinstance(n, ShardMap) else round_robin(n, count)
            self.cores = [assembly.new_syncer(ShardRole(name=s, map=shard_map), max_steps=whole) for s in shard_map.shards]
            self.owners, self.names = shard_map.owners, shard_map.shards

    def owner(self, fragment: int) -> Synchronizer:
        return self.cores[self.owners[fragment]]

    def moved(self, fragment: int, shard: int) -> None:
        """Shard ``shard`` took ``fragment`` in (a replayed handoff): updates of it are its from now on."""
        self.owners = tuple(shard if p == fragment else owner for p, owner in enumerate(self.owners))

    def global_params(self) -> dict[str, torch.Tensor]:
        """The model: each fragment's tensors from the shard that owns it."""
        return {name: t for p, owner in enumerate(self.owners) for name, t in self.cores[owner].fragments[p].items()}

    @property
    def rounds_closed(self) -> int:
        return sum(core.rounds_closed for core in self.cores)

    def ledger(self) -> TokenLedger:
        """The shards' books added up: each counts only its own fragments' fragment-tokens."""
        fields = [f.name for f in dataclasses.fields(TokenLedger)]
        return TokenLedger(**{k: sum(getattr(core.ledger, k) for core in self.cores) for k in fields})

    def last_step(self, learner: str) -> int:
        """The latest step any shard heard ``learner`` report (where a replacement resumes)."""
        return max((core.links[learner].pace.last_step for core in self.cores if learner in core.links), default=0)

    def next_wake(self) -> float | None:
        return min((w for core in self.cores if (w := core.next_wake()) is not None), default=None)


__all__ = ["Shards"]
