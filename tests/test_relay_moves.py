"""A relay that moves is found again (``relay.address``, ``GET /v1/relay``, ``agent/subscription``).

A relay tells each shard where its region's learners reach it; a learner whose relay stopped answering asks a shard
and moves there. That is how a relay whose host machine was replaced at another address serves the learners started
before it. Real processes at the end: the synchronizer, two relays one after the other, and synthetic learners.
"""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import pytest

from ddctl.local.relay import LocalRelay
from ddctl_agents.agent.client import Refused, SyncerClient, Unavailable
from ddctl_agents.agent.subscription import RelayLink, Subscriber
from ddctl_agents.errors import BadRequest
from ddctl_agents.relay import address, identity, on_loopback, own_address, url
from ddctl_agents.service.app import relay_at
from ddctl_agents.service.relay_feeds import RelayFeeds
from ddctl_agents.waiting import wait_until
from tests.relay_harness import (
    Counter,
    FakeShard,
    finished,
    relayed,
    start_learner,
    status_of,
    subscribed_until,
    version_frame,
)


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("10.0.0.5:29401", "10.0.0.5:29401"),
        ("[2001:db8::1]:443", "[2001:db8::1]:443"),
        ("Relay-1.East.internal:08443", "relay-1.east.internal:8443"),
    ],
)
def test_a_relays_address_is_host_and_port_normalised(text: str, normal: str) -> None:
    assert address(text) == normal


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.5", "must be HOST:PORT with a port from 1 to 65535, got '10.0.0.5'"),
        ("10.0.0.5:0", "with a port from 1 to 65535"),
        ("10.0.0.5:65536", "with a port from 1 to 65535"),
        ("10.0.0.5:\u0663", "with a port from 1 to 65535"),  # a digit, but not an ASCII one
        ("2001:db8::1:443", "an IPv6 host goes in brackets, [2001:db8::1]:443"),
        ("0.0.0.0:29401", "0.0.0.0 is not an address a learner can reach a relay at"),
        ("[::]:29401", ":: is not an address a learner can reach a relay at"),
        ("224.0.0.1:29401", "224.0.0.1 is not an address"),
        ("bad host:1", "a relay's host must be an IP address or a DNS name, got 'bad host'"),
        ("x\n.evil:1", "a relay's host must be an IP address or a DNS name"),
        ("x\n:1", "a relay's host must be an IP address or a DNS name"),  # a trailing newline, to forge a log line
        ("[name]:1", "a relay's host must be an IP address or a DNS name, got '[name]'"),
        ("-x.y:1", "must be an IP address or a DNS name"),
        ("a" * 301 + ":1", "at most 300 characters"),
    ],
)
def test_a_relays_address_is_refused_saying_what_is_allowed(text: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        address(text)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("https://10.0.0.5:29401", "https://10.0.0.5:29401"),
        ("https://[2001:db8::1]:0443", "https://[2001:db8::1]:443"),
        ("https://:29401", "https://:29401"),  # the relay's host is not known yet: the learner asks the shards
        ("http://127.0.0.1:8", "http://127.0.0.1:8"),
    ],
)
def test_a_learners_relay_url_is_normalised(text: str, normal: str) -> None:
    assert url(text) == normal


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.5:29401", "a relay URL is https://HOST:PORT (or https://:PORT before its host is known), got '10.0.0.5:29401'"),
        ("ftp://10.0.0.5:1", "a relay URL is https://HOST:PORT"),
        ("https://10.0.0.5:1/v1", "a relay URL is https://HOST:PORT"),
        ("https://[bad:1", "a relay's host must be an IP address or a DNS name, got '[bad'"),
        ("https://:0", "a relay URL's port must be from 1 to 65535, got 'https://:0'"),
        ("https://:x", "a relay URL's port must be from 1 to 65535"),
        ("https://0.0.0.0:1", "0.0.0.0 is not an address a learner can reach a relay at"),
    ],
)
def test_a_learners_relay_url_is_refused_saying_what_is_allowed(text: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        url(text)
    assert message in str(refused.value)


def test_a_relay_is_reached_at_its_bind_address_or_for_a_wildcard_at_its_route_to_the_shard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert own_address("10.1.2.3", 29401, "https://10.9.9.9:8443") == "10.1.2.3:29401"
    assert own_address("[::1]", 5, "https://10.9.9.9:8443") == "[::1]:5"
    assert own_address("0.0.0.0", 29401, "https://127.0.0.1:8443") == "127.0.0.1:29401"  # the route to the shard

    def no_name(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_name)
    with pytest.raises(ValueError, match=r"no route from this machine to https://s0.example:8443 .*; give --advertise"):
        own_address("0.0.0.0", 29401, "https://s0.example:8443")


def test_only_a_relay_says_where_it_is_and_only_a_valid_address_is_kept() -> None:
    assert relay_at("east", "10.0.0.5:29401") == "10.0.0.5:29401" and relay_at(None, "") == relay_at("east", "") == ""
    with pytest.raises(BadRequest, match="only a region's relay"):
        relay_at(None, "10.0.0.5:29401")  # a learner cannot send the region's learners somewhere
    with pytest.raises(BadRequest, match="at=: 0.0.0.0 is not an address"):
        relay_at("east", "0.0.0.0:29401")


def test_a_shard_gives_a_relays_address_only_while_that_relay_streams_from_it() -> None:
    feeds = RelayFeeds()
    assert feeds.located("east") == ""
    feeds.opened("east", now=1.0, address="10.0.0.5:29401")
    assert feeds.located("east") == "10.0.0.5:29401" and feeds.located("west") == ""
    feeds.closed("east", now=2.0)
    assert feeds.located("east") == ""  # gone: not an address to dial
    feeds.opened("east", now=3.0, address="10.0.0.7:29401")  # its host was replaced at another address
    feeds.opened("east", now=3.5)  # a relay that says nothing does not erase where the last one said it is
    assert feeds.located("east") == "10.0.0.7:29401"


def test_a_learner_whose_relay_stops_answering_moves_to_where_a_shard_says_it_is(caplog: pytest.LogCaptureFixture) -> None:
    stopping, counter = threading.Event(), Counter()
    old = FakeShard([], breaks=True)  # the replaced host: its relay does not answer
    new = FakeShard([version_frame(0, 3), version_frame(1, 3)])
    shard = FakeShard([], located="10.0.0.7:29401")
    relays = {"https://10.0.0.5:29401": old, "https://10.0.0.7:29401": new}
    dialled: list[str] = []

    def dial(url: str) -> FakeShard:
        dialled.append(url)
        return relays[url]

    link = RelayLink("https://10.0.0.5:29401", dial)  # type: ignore[arg-type]
    subscriber = Subscriber(lambda url: shard, 1, stopping, lambda url: None, counter, relay=link)  # type: ignore[arg-type,return-value]
    with caplog.at_level(logging.INFO, logger="ddctl_agents.agent.subscription"):
        subscribed_until(subscriber, [3, 3], "the versions from the relay where it is now")
    assert dialled == ["https://10.0.0.5:29401", "https://10.0.0.7:29401"] and link.url == "https://10.0.0.7:29401"
    assert "the region's relay is now at https://10.0.0.7:29401 (it was at https://10.0.0.5:29401)" in caplog.text
    assert new.asked and counter.down >= len(version_frame(0, 3)) * 2


def test_a_learner_started_while_its_relay_was_down_asks_the_shards_and_never_dials_no_host() -> None:
    stopping, counter = threading.Event(), Counter()
    relay = FakeShard([version_frame(0, 2), version_frame(1, 2)])
    shard = FakeShard([], located="10.0.0.7:29401")
    dialled: list[str] = []

    def dial(url: str) -> FakeShard:
        dialled.append(url)
        return relay

    link = RelayLink("https://:29401", dial)  # type: ignore[arg-type]
    subscriber = Subscriber(lambda url: shard, 1, stopping, lambda url: None, counter, relay=link)  # type: ignore[arg-type,return-value]
    subscribed_until(subscriber, [2, 2], "the versions from the relay a shard located")
    assert dialled == ["https://10.0.0.7:29401"] and link.url == "https://10.0.0.7:29401" and relay.asked


class DownShard(FakeShard):
    def relay_address(self) -> str:
        raise Unavailable("GET /v1/relay on https://s0: ConnectError")


def test_each_shard_is_asked_in_turn_until_one_knows_where_the_relay_is() -> None:
    shards = {"https://s0": DownShard([]), "https://s1": FakeShard([]), "https://s2": FakeShard([], located="10.0.0.7:29401")}
    asked: list[str] = []

    def connect(url: str) -> FakeShard:
        asked.append(url)
        return shards[url]

    subscriber = Subscriber(connect, 1, threading.Event(), lambda url: None, Counter())  # type: ignore[arg-type]
    assert subscriber._moved("https://10.0.0.5:29401", list(shards)) == "https://10.0.0.7:29401"
    assert asked == list(shards)  # s0 is down and s1 has no stream from the relay: s2 knows
    asked.clear()
    assert subscriber._moved("https://10.0.0.7:29401", list(shards)) == ""  # where it is already: no move
    shards["https://s2"].located = "10.0.0.5:29401"
    assert subscriber._moved("https://10.0.0.5:29401", ["https://s0", "https://s1"]) == ""  # nobody knows: stay


@pytest.mark.slow
def test_a_relay_started_at_another_address_serves_the_learners_of_the_one_that_died(tmp_path: Path) -> None:
    """L1 starts knowing only the relay's port (its host was down when it started) and finds it through a shard;
    both learners then find the relay's replacement at its new address."""
    with relayed(tmp_path, 2, 900_000) as (syncer, first):
        unknown = f"https://:{first.url.rpartition(':')[2]}"  # L1 started while its relay's host was down: no host
        procs = {
            name: start_learner(syncer, tmp_path, name, "east", first, 0.03, url) for name, url in (("L0", ""), ("L1", unknown))
        }
        serving = lambda r: lambda: (h := r.health())["subscribers"] == 2 and h["frames_in"] >= 4  # noqa: E731
        wait_until(serving(first), timeout_s=120, what="the first relay to serve both learners")
        learner = SyncerClient(syncer.url, syncer.token("L0"), syncer.ca)
        assert learner.relay_address() == first.url.split("://")[1]  # what the relay told the synchronizer
        first.kill()
        wait_until(lambda: learner.relay_address() == "", timeout_s=30, what="the synchronizer to forget the dead relay")
        second = LocalRelay(syncer, "east").start()  # the replacement: another port, as another machine's address would be
        assert second.url != first.url
        try:
            wait_until(serving(second), timeout_s=120, what="the learners to find the relay where it is now")
            assert learner.relay_address() == second.url.split("://")[1]
            summaries = finished(procs, tmp_path)
            status = status_of(syncer)
            # what a learner or a relay says of where a relay is is checked: a learner says nothing, a relay a real address
            with pytest.raises(Refused) as refused:
                next(learner.fragments([-1] * 4, at="127.0.0.1:5"))
            assert refused.value.status == 400 and "only a region's relay" in refused.value.reason
            as_relay = SyncerClient(syncer.url, syncer.token(identity("east")), syncer.ca)
            with pytest.raises(Refused) as refused:
                next(as_relay.fragments([-1] * 4, at="0.0.0.0:5"))
            assert refused.value.status == 400 and "0.0.0.0 is not an address" in refused.value.reason
            stranger = SyncerClient(syncer.url, syncer.token("L7"), syncer.ca)
            with pytest.raises(Refused) as refused:
                stranger.relay_address()
            assert refused.value.status == 404 and "register first" in refused.value.reason
            for client in (learner, as_relay, stranger):
                client.close()
        finally:
            second.stop()
    assert status["ledger"]["balanced"] and status["relays"]["east"]["streams"] == 1
    assert f"the region's relay is now at {first.url} (it was at {unknown})" in (tmp_path / "L1.log").read_text()
    for name, summary in summaries.items():
        log = (tmp_path / f"{name}.log").read_text()
        assert f"the region's relay is now at {second.url} (it was at {first.url})" in log, name
        assert summary["reason"] == "finished"


def test_over_plain_text_a_shards_word_moves_the_learner_only_to_a_loopback_relay(caplog: pytest.LogCaptureFixture) -> None:
    """No certificate names a plaintext relay's region, and one serves on loopback only: a shard's answer naming any
    other host would send the learner, and its token, wherever that shard says (audit F9)."""
    shard = FakeShard([], located="10.0.0.7:29401")
    subscriber = Subscriber(lambda url: shard, 1, threading.Event(), lambda url: None, Counter())  # type: ignore[arg-type,return-value]
    with caplog.at_level(logging.WARNING, logger="ddctl_agents.agent.subscription"):
        assert subscriber._moved("http://127.0.0.1:29401", ["http://s0"]) == ""
    assert "says the relay is at 10.0.0.7:29401: a plaintext relay serves on loopback only; not followed" in caplog.text
    for located in ("127.0.0.2:29402", "[::1]:29402", "localhost:29402"):
        shard.located = located
        assert subscriber._moved("http://127.0.0.1:29401", ["http://s0"]) == f"http://{located}"
    shard.located = "10.0.0.7:29401"  # with TLS the relay's certificate is checked by its region's name, wherever it is
    assert subscriber._moved("https://10.0.0.5:29401", ["https://s0"]) == "https://10.0.0.7:29401"


@pytest.mark.parametrize(
    ("normal", "loopback"),
    [("127.0.0.1:1", True), ("127.8.9.10:1", True), ("[::1]:1", True), ("localhost:1", True), ("10.0.0.7:1", False),
     ("[2001:db8::1]:1", False), ("relay.example:1", False), ("localhost.example:1", False)],
)  # fmt: skip
def test_only_a_loopback_address_is_on_loopback(normal: str, loopback: bool) -> None:
    assert on_loopback(normal) is loopback
