"""The synchronizer's whole state as one frame, for snapshots and recovery.

``capture`` is O(number of tensors) and copies no tensor data but a pending update's codes (kept packed, so a
restored round takes the fused path as the live one did, ``packed.stored``): the core never
mutates a tensor in place (outer steps and merges build new ones), so holding
references freezes the state at the capture point while rounds go on. The
frame is then packed off the core's thread. ``restore`` rebuilds a syncer that
behaves exactly like the captured one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ddctl_agents.core.ledger import TokenLedger
from ddctl_agents.core.links import LearnerLinks
from ddctl_agents.core.merge import Contribution
from ddctl_agents.core.packed import packed_parts, restored, stored
from ddctl_agents.core.rounds import RecentIds, Round
from ddctl_agents.core.schedule import check_cadence
from ddctl_agents.core.shard_syncer import ShardSynchronizer
from ddctl_agents.core.shardmap import ShardRole, parse
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.core.wire import WireLimits, pack, unpack
from ddctl_agents.errors import WireError

STATE_KIND = "syncer-state"
STATE_LIMITS = WireLimits(max_header=1 << 28, max_payload=1 << 40, max_tensors=1 << 20)
"""Our own snapshots may be far larger than any single network message."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncerState:
    meta: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    def to_bytes(self) -> bytes:
        return pack(STATE_KIND, self.meta, self.tensors, "fp32")


def capture(syncer: Synchronizer, extra: Mapping[str, Any] | None = None) -> SyncerState:
    """The syncer's state at this point, sharing (not copying) its immutable tensors."""
    tensors: dict[str, torch.Tensor] = {}
    rounds = []
    for p, frag in enumerate(syncer.fragments):
        tensors.update({f"f/{p}/{n}": t for n, t in frag.items()})
        tensors.update({f"b/{p}/{n}": t for n, t in syncer.buffers[p].items()})
        rnd = syncer.rounds[p]
        entry: dict[str, Any] = {"opened_at": rnd.opened_at, "quorum_met_at": rnd.quorum_met_at, "upload_bytes": rnd.upload_bytes}
        for kind in ("fresh", "late"):
            contributions = getattr(rnd, kind)
            entry[kind] = []
            for c in contributions.values():
                kept: dict[str, Any] = {"learner": c.learner, "c_steps": c.c_steps, "c_tokens": c.c_tokens, "periods": c.periods,
                                         "stale": c.stale}  # fmt: skip
                if (parts := packed_parts(c.tensors)) is not None:  # kept packed: the restored round fuses as the live one
                    kept["packed"], codes = stored(parts, f"k/{p}/{kind}/{c.learner}")
                    tensors.update(codes)
                else:
                    tensors.update({f"r/{p}/{kind}/{c.learner}/{n}": t for n, t in c.tensors.items()})
                entry[kind].append(kept)
        rounds.append(entry)
    ledger = syncer.ledger
    meta = {
        "versions": list(syncer.versions),
        "rounds_closed": syncer.rounds_closed,
        "live": dict(syncer.live),
        "cadence": dict(syncer.cadence),
        "ledger": ledger.as_dict(),
        "clock": dict(syncer.clock),
        "seen": {m: list(ids.order) for m, ids in syncer.seen_updates.items()},
        "last_step": {m: links.pace.last_step for m, links in syncer.links.items()},
        "rounds": rounds,
        "quarantine": syncer.quarantine.to_json(),
        "degraded": {str(p): reason for p, reason in syncer.degraded.items()},
        "faults": list(syncer.faults),
        "finished": sorted(syncer.finished),
        **({"shard_map": syncer.role.map.to_json()} if isinstance(syncer, ShardSynchronizer) else {}),
        **dict(extra or {}),
    }
    return SyncerState(meta=meta, tensors=tensors)


def load(data: bytes | bytearray | memoryview) -> SyncerState:
    frame = unpack(data, STATE_LIMITS, expect=STATE_KIND)
    return SyncerState(meta=dict(frame.meta), tensors=dict(frame.tensors))


def restore(syncer: Synchronizer, state: SyncerState) -> None:
    """Overwrite a freshly built syncer (same job) with a captured state."""
    meta, tensors = state.meta, state.tensors
    count = syncer.fragmentation.count
    if len(meta["versions"]) != count:
        raise WireError(f"snapshot has {len(meta['versions'])} fragments, this job has {count}")
    for p in range(count):
        names = list(syncer.fragments[p])
        syncer.fragments[p] = {n: _shaped(tensors[f"f/{p}/{n}"], syncer.fragments[p][n]) for n in names}
        syncer.buffers[p] = {n: _shaped(tensors[f"b/{p}/{n}"], syncer.fragments[p][n]) for n in names if f"b/{p}/{n}" in tensors}
        entry = meta["rounds"][p]
        rnd = Round(opened_at=entry["opened_at"], quorum_met_at=entry["quorum_met_at"], upload_bytes=entry["upload_bytes"])
        for kind in ("fresh", "late"):
            target = getattr(rnd, kind)
            for c in entry[kind]:
                ts: Mapping[str, torch.Tensor]
                if "packed" in c:
                    shapes = {n: tuple(syncer.fragments[p][n].shape) for n in names}
                    ts = restored(c["packed"], tensors, f"k/{p}/{kind}/{c['learner']}", shapes)
                else:
                    ts = {n: tensors[f"r/{p}/{kind}/{c['learner']}/{n}"] for n in names}
                target[c["learner"]] = Contribution(
                    learner=c["learner"],
                    tensors=ts,
                    c_steps=c["c_steps"],
                    c_tokens=c["c_tokens"],
                    periods=c.get("periods", 1),
                    stale=c.get("stale", 0),
                )
        syncer.rounds[p] = rnd
    syncer.versions = list(meta["versions"])
    syncer.rounds_closed = meta["rounds_closed"]
    syncer.live = dict(meta["live"])
    syncer.cadence = {m: check_cadence(k) for m, k in meta.get("cadence", {}).items()}  # absent before cadences existed
    syncer.ledger = TokenLedger(**meta["ledger"])
    syncer.clock = dict(meta["clock"])
    syncer.seen_updates = {}
    for m, ids in meta["seen"].items():
        window = RecentIds()
        for i in ids:
            window.add(i)
        syncer.seen_updates[m] = window
    syncer.quarantine.load_json(meta.get("quarantine", {}))  # absent in snapshots written before quarantine existed
    syncer.degraded = {int(p): str(reason) for p, reason in meta.get("degraded", {}).items()}
    syncer.faults = list(meta.get("faults", [0] * count))
    syncer.finished = set(meta.get("finished", []))  # absent in snapshots written before jobs could end
    for m, step in meta["last_step"].items():
        syncer.links.setdefault(m, LearnerLinks()).pace.last_step = step
    if isinstance(syncer, ShardSynchronizer) and "shard_map" in meta:  # ownership as handoffs left it
        syncer.role = ShardRole(name=syncer.role.name, map=parse(meta["shard_map"]))


def _shaped(stored: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return stored.reshape(like.shape).to(like.dtype)


__all__ = ["STATE_KIND", "SyncerState", "capture", "load", "restore"]
