"""Where a learner sends each fragment: its one synchronizer, or the shard that owns the fragment.

A learner is given every shard's address (``--syncer`` once per shard) and asks
each which shard it is (``GET /v1/shards``): the map names shards, the learner
pairs names with addresses. What a shard answers is checked like any peer's
answer (``core.shardmap.parse``); the newest map (highest epoch) wins. When a
shard refuses an update with 409 ``not_owner``, the learner asks it for its map
and routes by it if it is newer: ownership moved, and the update goes to the
new owner (it was not applied where it was refused).
"""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddctl_agents import relay
from ddctl_agents.agent.client import SyncerClient, retry
from ddctl_agents.core import shardmap
from ddctl_agents.core.shardmap import ShardMap
from ddctl_agents.errors import ConfigError

log = logging.getLogger(__name__)
Ask = Callable[[str], "Mapping[str, Any] | None"]
"""A shard's ``GET /v1/shards`` answer at a URL; None when that synchronizer is not sharded (404)."""


class Routes:
    """The shard map in force and each shard's address (thread-safe: uploaders refresh it)."""

    def __init__(self, urls: Mapping[str, str], map: ShardMap | None = None) -> None:
        self._urls, self._map, self._lock = dict(urls), map, threading.Lock()

    @property
    def map(self) -> ShardMap | None:
        return self._map

    @property
    def epoch(self) -> int:
        return 0 if self._map is None else self._map.epoch

    def urls(self) -> list[str]:
        """Every synchronizer this learner talks to, in shard order."""
        return list(self._urls.values())

    def url_of(self, fragment: int) -> str:
        with self._lock:
            if self._map is None:
                return next(iter(self._urls.values()))
            return self._urls[self._map.owner(fragment)]

    def url_of_shard(self, shard: str) -> str:
        return self._urls[shard]

    def adopt(self, answer: Mapping[str, Any] | None) -> bool:
        """Route by the map in a shard's answer if it is newer than ours; True when it was."""
        newer = _answer_map(answer)[1]
        with self._lock:
            if newer.epoch <= self.epoch:
                return False
            if self._map is not None and newer.fragments != self._map.fragments:
                raise ConfigError(f"shard map epoch {newer.epoch} assigns {newer.fragments} fragments, not {self._map.fragments}")
            missing = [s for s in newer.shards if s not in self._urls]
            if missing:
                raise ConfigError(f"shard map epoch {newer.epoch} names {', '.join(missing)}, whose address this learner lacks")
            self._map = newer
        log.info("shard map epoch %d: %s", newer.epoch, newer.to_json())
        return True


def syncer_url(text: str) -> str:
    """``text`` as a ``--syncer`` address, ``https://HOST:PORT`` (``http://`` for h2c on loopback; a trailing ``/``
    is dropped), normalised: checked at start, with what is allowed, not found at the first request as "unreachable"."""
    scheme, sep, rest = text.partition("://")
    rest = rest.removesuffix("/")
    if not sep or scheme not in ("https", "http") or any(c in rest for c in "/?#@"):
        raise ValueError(f"a synchronizer URL is https://HOST:PORT (http:// for h2c on loopback), got {text[:60]!r}")
    return f"{scheme}://{relay.address(rest, role='synchronizer')}"


def syncer_url_arg(text: str) -> str:
    """``syncer_url`` as an argparse type: a bad address exits 2 with its reason."""
    try:
        return syncer_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def ask_shard(connect: Callable[[str], SyncerClient], url: str) -> dict[str, Any] | None:
    """What the synchronizer at ``url`` says of its shard and map (None: it is not a shard); asked for two minutes."""
    client = connect(url)
    try:
        return retry(client.shards, give_up_after_s=120.0)
    finally:
        client.close()


def discover(urls: Sequence[str], ask: Ask) -> Routes:
    """Pair every given address with its shard's name and take the newest map any of them serves."""
    if not urls:
        raise ConfigError("give the synchronizer's address with --syncer (once per shard of a sharded one)")
    if len(set(urls)) != len(urls):
        raise ConfigError(f"--syncer addresses must differ, got {list(urls)}")
    answers = {url: ask(url) for url in urls}
    unsharded = [url for url, answer in answers.items() if answer is None]
    if unsharded:
        if len(urls) > 1:
            raise ConfigError(f"{', '.join(unsharded)} is not a shard: several --syncer addresses must all be shards of one job")
        return Routes({"": urls[0]})
    named: dict[str, str] = {}
    newest: ShardMap | None = None
    for url, answer in answers.items():
        name, served = _answer_map(answer)
        if name in named:
            raise ConfigError(f"{named[name]} and {url} both answer as shard {name}")
        named[name] = url
        newest = served if newest is None or served.epoch > newest.epoch else newest
    assert newest is not None
    missing = [s for s in newest.shards if s not in named]
    if missing:
        raise ConfigError(f"the shard map names {', '.join(missing)} but no --syncer address answers as it")
    return Routes({s: named[s] for s in newest.shards}, newest)


def _answer_map(answer: Mapping[str, Any] | None) -> tuple[str, ShardMap]:
    """A shard's answer, checked: its name and a valid map that names it."""
    if not isinstance(answer, Mapping) or not isinstance(answer.get("shard"), str):
        raise ConfigError("a shard's answer must be an object with 'shard' (its name) and 'map'")
    served = shardmap.parse(answer.get("map"))
    served.index(answer["shard"])
    return answer["shard"], served
