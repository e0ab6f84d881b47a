"""Which synchronizer shard owns which fragment: a versioned map every shard serves.

Every fragment already has its own version, Nesterov buffer, rounds and quorum
decision, so shards that own whole fragments need no coordination in normal
operation: a learner routes each fragment's update to its owner and subscribes
to every shard's stream. The map names shards, not addresses: a learner is given
every shard's address and asks each for its name (``GET /v1/shards``), so one
map file serves a job whatever ports or hosts its shards end up on. ``epoch``
grows with every change of ownership; a shard that no longer owns a fragment
answers 409 ``not_owner`` with the owner and its epoch, and the learner fetches
the newer map. A shard map read from a file or a peer is checked here in type,
range and shape before anything routes by it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddctl_agents.core import vclock
from ddctl_agents.errors import ConfigError, NotOwner

SHARD_NAME = re.compile(r"^S[0-9]{1,3}\Z")  # \Z: "$" lets a trailing newline through
"""Shard names are S0, S1, ...: short, and never a learner's name (L0, L1, ...) in a vector clock."""
MAX_SHARDS = 64
MAX_FRAGMENTS = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardMap:
    """``owners[p]`` is the index in ``shards`` of fragment p's owner."""

    epoch: int
    shards: tuple[str, ...]
    owners: tuple[int, ...]

    def __post_init__(self) -> None:
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or not 1 <= self.epoch < 2**53:
            raise ConfigError(f"shard map epoch must be an integer >= 1, got {self.epoch!r}")
        if not 1 <= len(self.shards) <= MAX_SHARDS:
            raise ConfigError(f"a shard map names 1..{MAX_SHARDS} shards, got {len(self.shards)}")
        for name in self.shards:
            if not isinstance(name, str) or not SHARD_NAME.match(name):
                raise ConfigError(f"shard names are S0, S1, ... (S and 1-3 digits), got {name!r:.40}")
        if len(set(self.shards)) != len(self.shards):
            raise ConfigError(f"shard names must be unique, got {list(self.shards)}")
        if not 1 <= len(self.owners) <= MAX_FRAGMENTS:
            raise ConfigError(f"a shard map assigns 1..{MAX_FRAGMENTS} fragments, got {len(self.owners)}")
        for p, owner in enumerate(self.owners):
            if isinstance(owner, bool) or not isinstance(owner, int) or not 0 <= owner < len(self.shards):
                raise ConfigError(f"fragment {p}'s owner must be a shard index in [0, {len(self.shards)}), got {owner!r:.40}")

    @property
    def fragments(self) -> int:
        return len(self.owners)

    def owner(self, fragment: int) -> str:
        return self.shards[self.owners[fragment]]

    def owned(self, shard: str) -> frozenset[int]:
        index = self.index(shard)
        return frozenset(p for p, owner in enumerate(self.owners) if owner == index)

    def index(self, shard: str) -> int:
        if shard not in self.shards:
            raise ConfigError(f"shard {shard!r:.40} is not in the shard map (it names {', '.join(self.shards)})")
        return self.shards.index(shard)

    def peers(self, shard: str) -> tuple[str, ...]:
        """The other shards: entries of every shard's vector clock besides its own."""
        return tuple(s for s in self.shards if s != shard)

    def check_fragments(self, fragments: int) -> None:
        """The map must assign exactly the job's fragments."""
        if fragments != self.fragments:
            raise ConfigError(f"the shard map assigns {self.fragments} fragments but the job has {fragments}")

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "shards": list(self.shards), "owners": list(self.owners)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRole:
    """One synchronizer process's place in a sharded job: its name and the map it serves."""

    name: str
    map: ShardMap

    def __post_init__(self) -> None:
        self.map.index(self.name)

    @property
    def owned(self) -> frozenset[int]:
        return self.map.owned(self.name)

    def refuse_unless_owned(self, fragment: int) -> None:
        """Raise NotOwner (409, with the owner and epoch) for a fragment another shard owns."""
        if 0 <= fragment < self.map.fragments and self.map.owners[fragment] != self.map.index(self.name):
            owner = self.map.owner(fragment)
            raise NotOwner(
                f"shard {self.name} does not own fragment {fragment} at shard map epoch {self.map.epoch}: "
                f"shard {owner} does (GET /v1/shards for the map)",
                owner,
                self.map.epoch,
            )


def refuse_unless_owned(role: ShardRole | None, fragment: int) -> None:
    """NotOwner (409) from a shard for a fragment it does not own; a synchronizer that is not sharded owns all."""
    if role is not None:
        role.refuse_unless_owned(fragment)


def round_robin(shards: int, fragments: int, epoch: int = 1) -> ShardMap:
    """Fragment p to shard p mod N: neighbours in the staggered schedule (due one after another) on different shards."""
    if not 1 <= shards <= min(MAX_SHARDS, fragments):
        raise ConfigError(f"shards must be in 1..{min(MAX_SHARDS, fragments)} (at most one per fragment), got {shards}")
    return ShardMap(epoch=epoch, shards=tuple(f"S{i}" for i in range(shards)), owners=tuple(p % shards for p in range(fragments)))


def from_assignment(assignment: Sequence[int], epoch: int = 1) -> ShardMap:
    """The map of a plan's fragment-to-shard assignment (shard i named Si)."""
    count = max(assignment, default=-1) + 1
    return ShardMap(epoch=epoch, shards=tuple(f"S{i}" for i in range(max(count, 1))), owners=tuple(assignment))


def parse(raw: object) -> ShardMap:
    """A shard map from untrusted JSON; ConfigError says what is wrong with it."""
    if not isinstance(raw, Mapping) or set(raw) != {"epoch", "shards", "owners"}:
        raise ConfigError("a shard map is an object with exactly the keys epoch, shards and owners")
    shards, owners = raw["shards"], raw["owners"]
    if not isinstance(shards, list) or not isinstance(owners, list):
        raise ConfigError("a shard map's shards and owners must be lists")
    if len(shards) > MAX_SHARDS or len(owners) > MAX_FRAGMENTS:
        raise ConfigError(f"a shard map holds at most {MAX_SHARDS} shards and {MAX_FRAGMENTS} fragments")
    return ShardMap(epoch=raw["epoch"], shards=tuple(shards), owners=tuple(owners))


def clock_entry(shard: str | None) -> str:
    """The process name a synchronizer stamps its events with: its shard's name, or ``syncer`` when alone."""
    return shard or vclock.SYNCER
