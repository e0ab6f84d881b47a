"""The shard map, a shard's refusals, and how a learner routes by the map (no processes: fakes answer)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from ddctl_agents.agent.comm import Comms, Identity
from ddctl_agents.agent.routes import Routes, discover, syncer_url
from ddctl_agents.core import shardmap
from ddctl_agents.core.shard_syncer import HANDOFF_KIND, HANDOFF_LIMITS, ShardSynchronizer
from ddctl_agents.core.shardmap import ShardMap, ShardRole
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.core.syncer_state import capture, load, restore
from ddctl_agents.core.wire import unpack
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
        ({"epoch": 1, "shards": ["S0\n"], "owners": [0]}, "shard names are S0, S1"),  # a trailing newline forges log lines
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

    def push(self, frame: bytes, fragment: int, based_in: str = "") -> dict[str, Any]:
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


def test_a_409_from_a_shard_whose_map_is_not_newer_is_retried_while_a_handoff_is_in_flight() -> None:
    m = shardmap.round_robin(2, 4, epoch=1)
    shards = {"https://a": FakeShard("S0", m), "https://b": FakeShard("S1", m)}
    routes = Routes({"S0": "https://a", "S1": "https://b"}, m)
    comms = Comms(lambda url: shards[url], routes, Identity(name="L0", incarnation=1, region="r"), "int4", 64)  # type: ignore[arg-type,return-value]
    with pytest.raises(Unavailable, match="a handoff is in flight"):  # retried with backoff, never counted as refused
        comms._push(shards["https://a"], "https://a", b"frame", 1)  # type: ignore[arg-type]
    assert routes.epoch == 1 and routes.url_of(1) == "https://b"


# -- handoffs in the core ---------------------------------------------------------------------------
def two_shards() -> tuple[ShardSynchronizer, ShardSynchronizer]:
    from tests.builders import small_syncer

    base = small_syncer(fragments=2)
    m = shardmap.round_robin(2, 2)
    made = (base.global_params(), base.fragmentation, base.embeddings, base.config, None)
    return ShardSynchronizer(*made, ShardRole(name="S0", map=m)), ShardSynchronizer(*made, ShardRole(name="S1", map=m))


def test_a_handed_out_fragment_is_installed_once_with_its_state_and_update_ids() -> None:
    from tests.builders import update_for

    s0, s1 = two_shards()
    s0.register(0.0, "L0")
    first = update_for(s0, "L0", 0, value=0.01)
    assert s0.receive(1.0, first)[0].status == "accepted"
    effects = s0.hand_out(2.0, 0, "S1", 2)
    assert [e.entry["type"] for e in effects if hasattr(e, "entry")] == ["round", "handoff"]  # the open round closed first
    assert s0.versions[0] == 1 and s0.role.owned == frozenset() and s0.hand_out(3.0, 0, "S1", 2) == []
    with pytest.raises(NotOwner):
        s0.receive(3.0, update_for(s0, "L0", 0))
    s1.register(0.0, "L0")
    installed = s1.hand_in(4.0, s0.export(0))
    assert s1.versions[0] == 1 and s1.role.owned == frozenset({0, 1}) and s1.role.map.epoch == 2
    assert all(torch.equal(s1.fragments[0][n], t) for n, t in s0.fragments[0].items())
    assert [e.message.version for e in installed if hasattr(e, "message")] == [1]
    assert s1.hand_in(5.0, s0.export(0)) == []  # asked again: nothing changes
    retried = replace(first, base_version=0)
    assert s1.receive(6.0, retried)[0].status == "duplicate"  # its ack was lost at S0; S1 knows it was applied


def test_a_hostile_export_is_refused_before_anything_is_installed() -> None:
    from ddctl_agents.core.wire import pack

    s0, s1 = two_shards()
    s0.hand_out(0.0, 0, "S1", 2)
    good = s0.export(0)
    frame = unpack(good, HANDOFF_LIMITS, expect=HANDOFF_KIND)
    meta, tensors = dict(frame.meta), dict(frame.tensors)

    def export(**changes: object) -> bytes:
        return pack(HANDOFF_KIND, {**meta, **changes.get("meta", {})}, changes.get("tensors", tensors), "fp32")  # type: ignore[arg-type]

    name = next(iter(tensors))
    cases = [
        (export(meta={"fragment": 7}), "not one of this job's"),
        (export(meta={"version": -1}), "not one of this job's"),
        (export(meta={"map": shardmap.round_robin(2, 2, epoch=2).to_json()}), "does not give fragment 0 to shard S1"),
        (export(meta={"seen": {"L0": [1]}}), "recent update ids"),
        (export(tensors={**tensors, name: torch.full((9,), 1.0)}), "shape"),
        (export(tensors={k: v for k, v in tensors.items() if k != name}), "exactly its tensors"),
        (export(meta={"map": {"epoch": 2}}), "exactly the keys"),
    ]
    before = dict(s1.fragments[0])
    for data, message in cases:
        with pytest.raises(ConfigError, match=message):
            s1.hand_in(1.0, data)
    assert s1.fragments[0] == before and s1.role.map.epoch == 1
    s1.hand_in(1.0, good)
    stale = ShardMap(epoch=2, shards=("S0", "S1"), owners=(1, 1))
    with pytest.raises(ConfigError, match="is not past this shard's 2"):
        s1.hand_in(2.0, export(meta={"map": stale.to_json(), "version": 5}))


def test_a_shards_ownership_survives_a_snapshot() -> None:
    s0, _ = two_shards()
    s0.hand_out(0.0, 0, "S1", 2)
    fresh, _ = two_shards()  # built from the flag's map, as a restarted shard is
    restore(fresh, load(capture(s0).to_bytes()))
    assert fresh.role.map.epoch == 2 and fresh.role.owned == frozenset() and fresh.role.name == "S0"


def test_a_map_naming_a_shard_without_an_address_refuses_the_update_instead_of_stopping_the_uploader() -> None:
    m = shardmap.round_robin(2, 4, epoch=1)
    three = ShardMap(epoch=2, shards=("S0", "S1", "S2"), owners=(0, 2, 0, 1))
    shards = {"https://a": FakeShard("S0", three), "https://b": FakeShard("S1", three)}  # S1 gave fragment 1 to S2
    routes = Routes({"S0": "https://a", "S1": "https://b"}, m)
    comms = Comms(lambda url: shards[url], routes, Identity(name="L0", incarnation=1, region="r"), "int4", 64)  # type: ignore[arg-type,return-value]
    with pytest.raises(Refused, match="names S2, whose address this learner lacks"):
        comms._push(shards["https://b"], "https://b", b"frame", 1)  # type: ignore[arg-type]
    assert routes.epoch == 1


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("https://10.0.0.5:8443", "https://10.0.0.5:8443"),
        ("https://Syncer.Example.COM:8443/", "https://syncer.example.com:8443"),  # a DNS name, a trailing slash
        ("https://[fd00::7]:8443", "https://[fd00::7]:8443"),
        ("http://127.0.0.1:9", "http://127.0.0.1:9"),
    ],
)
def test_a_syncer_url_is_normalised(text: str, normal: str) -> None:
    assert syncer_url(text) == normal


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.5:8443", "a synchronizer URL is https://HOST:PORT (http:// for h2c on loopback), got '10.0.0.5:8443'"),
        ("ftp://10.0.0.5:1", "a synchronizer URL is https://HOST:PORT"),
        ("https://10.0.0.5:1/v1", "a synchronizer URL is https://HOST:PORT"),
        ("https://user@10.0.0.5:1", "a synchronizer URL is https://HOST:PORT"),
        ("https://[bad:1", "a synchronizer's host must be an IP address or a DNS name, got '[bad'"),
        ("https://10.0.0.5", "a synchronizer's address must be HOST:PORT with a port from 1 to 65535"),
        ("https://10.0.0.5:0", "a synchronizer's address must be HOST:PORT with a port from 1 to 65535"),
        ("https://fd00::7:8443", "an IPv6 host goes in brackets, [fd00::7]:8443"),
        ("https://0.0.0.0:8443", "0.0.0.0 is not an address a learner can reach a synchronizer at"),
    ],
)
def test_a_syncer_url_is_refused_saying_what_is_allowed(text: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        syncer_url(text)
    assert message in str(refused.value)
