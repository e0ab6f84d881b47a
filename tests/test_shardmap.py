"""The shard map, a shard's refusals, and how a learner routes by the map (no processes: fakes answer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddctl_agents.agent.comm import Comms, Identity
from ddctl_agents.agent.routes import Routes, discover
from ddctl_agents.core import shardmap
from ddctl_agents.core.shardmap import ShardMap, ShardRole
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.errors import ConfigError, NotOwner, Refused, Unavailable
from ddctl_agents.service.recovery import claim


def test_round_robin_spreads_neighbouring_fragments_over_shards() -> None:
    m = shardmap.round_robin(3, 8)
    assert m.shards == ("S0", "S1", "S2")
    assert [m.owner(p) for p in range(8)] == ["S0", "S1", "S2", "S0", "S1", "S2", "S0", "S1"]
    assert m.owned("S1") == frozenset({1, 4, 7})
    assert set().union(*(m.owned(s) for s in m.shards)) == set(range(8))
    assert m.peers("S1") == ("S0", "S2")
    assert shardmap.parse(m.to_json()) == m


def test_a_plan_assignment_becomes_a_map() -> None:
    m = shardmap.from_assignment([1, 0, 1, 1])
    assert m.shards == ("S0", "S1") and m.owned("S0") == frozenset({1})


@pytest.mark.parametrize("shards, fragments", [(0, 4), (5, 4), (65, 100)])
def test_round_robin_refuses_impossible_counts(shards: int, fragments: int) -> None:
    with pytest.raises(ConfigError, match="shards must be in 1.."):
        shardmap.round_robin(shards, fragments)


@pytest.mark.parametrize(
    "raw, message",
    [
        ([], "exactly the keys"),
        ({"epoch": 1, "shards": ["S0"]}, "exactly the keys"),
        ({"epoch": 1, "shards": ["S0"], "owners": [0], "extra": 1}, "exactly the keys"),
        ({"epoch": True, "shards": ["S0"], "owners": [0]}, "epoch must be an integer >= 1"),
        ({"epoch": 0, "shards": ["S0"], "owners": [0]}, "epoch must be an integer >= 1"),
        ({"epoch": "1", "shards": ["S0"], "owners": [0]}, "epoch must be an integer >= 1"),
        ({"epoch": 1, "shards": "S0", "owners": [0]}, "must be lists"),
        ({"epoch": 1, "shards": ["L0"], "owners": [0]}, "shard names are S0, S1"),
        ({"epoch": 1, "shards": ["S0", "S0"], "owners": [0]}, "unique"),
        ({"epoch": 1, "shards": [], "owners": [0]}, "1..64 shards"),
        ({"epoch": 1, "shards": ["S0"], "owners": []}, "1..4096 fragments"),
        ({"epoch": 1, "shards": ["S0"], "owners": [1]}, "owner must be a shard index in \\[0, 1\\)"),
        ({"epoch": 1, "shards": ["S0"], "owners": [-1]}, "owner must be a shard index"),
        ({"epoch": 1, "shards": ["S0"], "owners": [0.0]}, "owner must be a shard index"),
        ({"epoch": 1, "shards": ["S0"], "owners": [False]}, "owner must be a shard index"),
        ({"epoch": 1, "shards": ["S0"], "owners": [0] * 5000}, "at most 64 shards and 4096 fragments"),
    ],
)
def test_a_hostile_map_is_refused_with_what_is_wrong(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        shardmap.parse(raw)


def test_a_shard_refuses_a_fragment_it_does_not_own_naming_the_owner_and_epoch() -> None:
    role = ShardRole(name="S0", map=shardmap.round_robin(2, 4, epoch=3))
    role.refuse_unless_owned(0)
    role.refuse_unless_owned(2)
    with pytest.raises(NotOwner, match="shard S0 does not own fragment 1 at shard map epoch 3: shard S1 does") as info:
        role.refuse_unless_owned(1)
    assert info.value.details == {"owner": "S1", "epoch": 3}
    assert (info.value.status, info.value.code) == (409, "not_owner")
    with pytest.raises(ConfigError, match="not in the shard map"):
        ShardRole(name="S2", map=role.map)


def test_a_state_directory_belongs_to_one_shard(tmp_path: Path) -> None:
    claim(tmp_path, "S0")
    claim(tmp_path, "S0")
    with pytest.raises(ConfigError, match="holds the state of 'S0', not 'S1'"):
        claim(tmp_path, "S1")


def test_a_shards_vector_clock_has_an_entry_per_shard() -> None:
    from tests.builders import small_syncer

    base = small_syncer()
    role = ShardRole(name="S1", map=shardmap.round_robin(3, 4))
    syncer = Synchronizer(
        base.global_params(), base.fragmentation, base.embeddings, base.config, None, (role.name, role.map.peers("S1"))
    )
    assert syncer.clock == {"S0": 0, "S1": 0, "S2": 0, "cut": 0}  # cut: a global checkpoint's epoch (service/cuts.py)
    syncer.register(0.0, "L0")
    assert syncer.clock == {"S0": 0, "S1": 1, "S2": 0, "cut": 0}
    syncer.cut(1.0, 1, "marker")
    assert syncer.clock == {"S0": 0, "S1": 2, "S2": 0, "cut": 1}
    assert base.clock == {"syncer": 0}


# -- the learner's side ---------------------------------------------------------------------------
def answer(name: str, m: ShardMap) -> dict[str, Any]:
    return {"shard": name, "map": m.to_json()}


def test_discover_pairs_each_address_with_its_shard_and_takes_the_newest_map() -> None:
    old, new = shardmap.round_robin(2, 4, epoch=1), ShardMap(epoch=2, shards=("S0", "S1"), owners=(1, 1, 0, 0))
    answers = {"https://b": answer("S1", new), "https://a": answer("S0", old)}
    routes = discover(["https://b", "https://a"], answers.__getitem__)
    assert routes.epoch == 2 and routes.urls() == ["https://a", "https://b"]
    assert [routes.url_of(p) for p in range(4)] == ["https://b", "https://b", "https://a", "https://a"]


def test_one_unsharded_synchronizer_gets_every_fragment() -> None:
    routes = discover(["https://one"], lambda url: None)
    assert routes.map is None and {routes.url_of(p) for p in range(5)} == {"https://one"}


@pytest.mark.parametrize(
    "answers, message",
    [
        ({"https://a": None, "https://b": answer("S1", shardmap.round_robin(2, 4))}, "https://a is not a shard"),
        (
            {"https://a": answer("S0", shardmap.round_robin(2, 4)), "https://b": answer("S0", shardmap.round_robin(2, 4))},
            "both answer as shard S0",
        ),  # fmt: skip
        ({"https://a": answer("S0", shardmap.round_robin(3, 4))}, "names S1, S2 but no --syncer address answers"),
        ({"https://a": {"shard": "S0", "map": {"epoch": 1}}}, "exactly the keys"),
        ({"https://a": {"shard": "S5", "map": shardmap.round_robin(2, 4).to_json()}}, "not in the shard map"),
        ({"https://a": ["S0"]}, "must be an object"),
    ],
)
def test_discover_refuses_what_cannot_be_routed(answers: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        discover(list(answers), answers.__getitem__)


def test_a_newer_map_is_adopted_an_older_one_ignored() -> None:
    m1 = shardmap.round_robin(2, 4, epoch=1)
    routes = Routes({"S0": "https://a", "S1": "https://b"}, m1)
    assert not routes.adopt(answer("S0", m1))
    moved = ShardMap(epoch=2, shards=("S0", "S1"), owners=(0, 0, 0, 1))
    assert routes.adopt(answer("S1", moved)) and routes.url_of(1) == "https://a"
    with pytest.raises(ConfigError, match="whose address this learner lacks"):
        routes.adopt(answer("S0", ShardMap(epoch=3, shards=("S0", "S2"), owners=(0, 1, 0, 1))))
    with pytest.raises(ConfigError, match="assigns 2 fragments, not 4"):
        routes.adopt(answer("S0", ShardMap(epoch=4, shards=("S0", "S1"), owners=(0, 1))))
    assert routes.epoch == 2


class FakeShard:
    """A shard's client: refuses fragment pushes it does not own (409) and serves its map."""

    def __init__(self, name: str, served: ShardMap) -> None:
        self.name, self.served, self.pushed = name, served, []  # type: list[int]

    def push(self, frame: bytes, fragment: int) -> dict[str, Any]:
        if self.served.owner(fragment) != self.name:
            raise Refused(409, "not_owner", f"shard {self.name} does not own fragment {fragment}")
        self.pushed.append(fragment)
        return {"status": "accepted"}

    def shards(self) -> dict[str, Any]:
        return answer(self.name, self.served)


def test_a_misrouted_update_is_retried_at_the_owner_of_the_newer_map() -> None:
    stale, moved = shardmap.round_robin(2, 4, epoch=1), ShardMap(epoch=2, shards=("S0", "S1"), owners=(0, 0, 0, 1))
    shards = {"https://a": FakeShard("S0", moved), "https://b": FakeShard("S1", moved)}
    routes = Routes({"S0": "https://a", "S1": "https://b"}, stale)
    comms = Comms(lambda url: shards[url], routes, Identity(name="L0", incarnation=1, region="r"), "int4", 64)  # type: ignore[arg-type,return-value]
    url = routes.url_of(1)
    assert url == "https://b"
    with pytest.raises(Unavailable, match="routing by the newer shard map"):
        comms._push(shards[url], url, b"frame", 1)  # type: ignore[arg-type]
    assert routes.epoch == 2 and routes.url_of(1) == "https://a"
    assert comms._push(shards["https://a"], "https://a", b"frame", 1) == {"status": "accepted"}  # type: ignore[arg-type]
    assert shards["https://a"].pushed == [1] and shards["https://b"].pushed == []


def test_a_409_from_a_shard_whose_map_is_not_newer_stays_a_refusal() -> None:
    m = shardmap.round_robin(2, 4, epoch=1)
    shards = {"https://a": FakeShard("S0", m), "https://b": FakeShard("S1", m)}
    routes = Routes({"S0": "https://a", "S1": "https://b"}, m)
    comms = Comms(lambda url: shards[url], routes, Identity(name="L0", incarnation=1, region="r"), "int4", 64)  # type: ignore[arg-type,return-value]
    with pytest.raises(Refused, match="not_owner"):
        comms._push(shards["https://a"], "https://a", b"frame", 1)  # type: ignore[arg-type]
    assert routes.epoch == 1
