"""One shard of a sharded synchronizer: the synchronizer, owning only the fragments its map gives it.

Ownership is core state, moved by events like any other, so a shard's log
replays it: ``hand_out`` gives a fragment to another shard (its open round is
closed first with what arrived, so no acknowledged update is left behind), and
``hand_in`` installs what the previous owner exported: the fragment's values,
Nesterov buffer and version, and every learner's recent update ids, so an update
whose acknowledgement was lost and is retried at the new owner is still applied
once. Both move the map's epoch; an update or a bootstrap of a fragment this
shard does not own is refused with the owner (``NotOwner``, 409).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ddctl_agents.core import vclock
from ddctl_agents.core.admission import UpdateLimits
from ddctl_agents.core.config import SyncerConfig
from ddctl_agents.core.effects import Ack, Effect, Send
from ddctl_agents.core.fragments import Fragmentation
from ddctl_agents.core.messages import Update
from ddctl_agents.core.rounds import RecentIds
from ddctl_agents.core.shardmap import ShardMap, ShardRole, parse, refuse_unless_owned
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.core.wire import WireLimits, pack, unpack
from ddctl_agents.errors import ConfigError

Tensors = dict[str, torch.Tensor]
HANDOFF_KIND = "fragment-handoff"
HANDOFF_LIMITS = WireLimits(max_header=1 << 26, max_payload=1 << 40, max_tensors=1 << 16)


class ShardSynchronizer(Synchronizer):
    """A ``Synchronizer`` that owns the fragments ``role`` gives it; see the module docstring."""

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        fragmentation: Fragmentation,
        embeddings: frozenset[str],
        config: SyncerConfig,
        limits: UpdateLimits | None,
        role: ShardRole,
    ) -> None:
        super().__init__(params, fragmentation, embeddings, config, limits, (role.name, role.map.peers(role.name)))
        role.map.check_fragments(fragmentation.count)
        self.role = role
        self.moves = {"out": 0, "in": 0}
        """Handoffs this shard's state has made, each way (for /metrics; counted again when a log replays)."""

    def register(self, now: float, learner: str, incarnation: int = 0, start_step: int = 0, cadence: int = 1) -> list[Effect]:
        """As the synchronizer's, bootstrapping only the fragments this shard owns."""
        owned = self.role.owned
        effects = super().register(now, learner, incarnation, start_step, cadence)
        return [e for e in effects if not isinstance(e, Send) or e.message.fragment in owned]

    def receive(self, now: float, update: Update, nbytes: int = 0) -> tuple[Ack, list[Effect]]:
        refuse_unless_owned(self.role, update.fragment)
        return super().receive(now, update, nbytes)

    def hand_out(self, now: float, p: int, to: str, epoch: int) -> list[Effect]:
        """Give fragment ``p`` to shard ``to`` at map epoch ``epoch`` ([] if that has happened already)."""
        current = self.role.map
        if epoch <= current.epoch:
            if current.owner(p) == to and p not in self.role.owned:
                return []
            raise ConfigError(f"shard map epoch {epoch} is not past this shard's {current.epoch}")
        refuse_unless_owned(self.role, p)
        current.index(to)
        effects: list[Effect] = []
        if self.rounds[p].fresh or self.rounds[p].late:
            effects += self.close_round(now, p, "handoff", f"fragment {p} moves to shard {to}: merging what arrived")
        owners = tuple(current.index(to) if q == p else o for q, o in enumerate(current.owners))
        self.role = ShardRole(name=self.role.name, map=ShardMap(epoch=epoch, shards=current.shards, owners=owners))
        self.moves["out"] += 1
        self.clock = vclock.tick(self.clock, self.process)
        return [*effects, self._record(now, "handoff", fragment=p, to=to, epoch=epoch, version=self.versions[p])]

    def export(self, p: int) -> bytes:
        """What the next owner of ``p`` needs, as one frame: values, buffer, version, recent update ids, the map."""
        meta = {"fragment": p, "version": self.versions[p], "from": self.role.name, "map": self.role.map.to_json(),
                "seen": {m: list(ids.order) for m, ids in self.seen_updates.items()}}  # fmt: skip
        tensors = {f"f/{n}": t for n, t in self.fragments[p].items()} | {f"b/{n}": t for n, t in self.buffers[p].items()}
        return pack(HANDOFF_KIND, meta, tensors, "fp32")

    def hand_in(self, now: float, data: bytes) -> list[Effect]:
        """Install a fragment another shard exported to this one ([] if it is installed already)."""
        p, version, shard_map, seen, values, buffer = self._checked(data)
        if shard_map.epoch <= self.role.map.epoch:
            if p in self.role.owned and self.versions[p] == version:
                return []
            raise ConfigError(f"handoff at shard map epoch {shard_map.epoch} is not past this shard's {self.role.map.epoch}")
        self.fragments[p], self.buffers[p], self.versions[p] = values, buffer, version
        for learner, ids in seen.items():
            window = self.seen_updates.setdefault(learner, RecentIds())
            for i in ids:
                if i not in window:
                    window.add(i)
        self.role = ShardRole(name=self.role.name, map=shard_map)
        self.moves["in"] += 1
        self.clock = vclock.tick(self.clock, self.process)
        record = self._record(now, "handoff", fragment=p, to=self.role.name, epoch=shard_map.epoch, version=version)
        return [record, Send(to=tuple(sorted(self.live)), message=self.fragment_message(p), reason="round")]

    def _checked(
        self, data: bytes
    ) -> tuple[int, int, ShardMap, dict[str, list[str]], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """An exported fragment, checked in type, range and shape against this job before anything is installed."""
        frame = unpack(data, HANDOFF_LIMITS, expect=HANDOFF_KIND)
        meta: dict[str, Any] = dict(frame.meta)
        shard_map = parse(meta.get("map"))
        p, version = meta.get("fragment"), meta.get("version")
        if not isinstance(p, int) or not 0 <= p < self.fragmentation.count or not isinstance(version, int) or version < 0:
            raise ConfigError(f"a handoff names fragment {p!r:.20} at version {version!r:.20}: not one of this job's")
        if shard_map.fragments != self.fragmentation.count or shard_map.owner(p) != self.role.name:
            raise ConfigError(f"the handoff's shard map does not give fragment {p} to shard {self.role.name}")
        seen = meta.get("seen")
        if not isinstance(seen, dict) or not all(
            isinstance(v, list) and all(isinstance(i, str) for i in v) for v in seen.values()
        ):
            raise ConfigError("a handoff's recent update ids must map learners to lists of ids")
        like = self.fragments[p]
        values = {n[2:]: t for n, t in frame.tensors.items() if n.startswith("f/")}
        buffer = {n[2:]: t for n, t in frame.tensors.items() if n.startswith("b/")}
        if set(values) != set(like) or not set(buffer) <= set(like) or len(values) + len(buffer) != len(frame.tensors):
            raise ConfigError(f"a handoff of fragment {p} must carry exactly its tensors {sorted(like)}")
        for name, t in (*values.items(), *buffer.items()):
            if tuple(t.shape) != tuple(like[name].shape) or not bool(torch.isfinite(t).all()):
                raise ConfigError(f"a handoff's {name} must be finite with shape {tuple(like[name].shape)}")
        return p, version, shard_map, seen, {n: t.float() for n, t in values.items()}, {n: t.float() for n, t in buffer.items()}
