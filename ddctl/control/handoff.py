"""``ddctl syncer move``: give one fragment to another shard of a running sharded synchronizer.

The owner hands the fragment out (it closes the fragment's open round, logs the
handoff and moves its map), then the new owner takes the export in (logged,
installed, published); learners are refused at the old owner with the new one's
name and retry there. A move that stopped half way (this command, or a shard,
killed) is finished by running the same command again: the new owner's own map
still names the old owner as the one to ask, and the old owner answers a
hand-out it has made already with the same export.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ddctl.errors import DdctlError, UnreachableError
from ddctl_agents.agent.client import SyncerClient, Unavailable, retry
from ddctl_agents.agent.routes import discover
from ddctl_agents.core import shardmap


def move(urls: list[str], connect: Callable[[str], SyncerClient], fragment: int, to: str) -> dict[str, Any]:
    """Move ``fragment`` to shard ``to`` (every shard's URL in ``urls``)."""
    if fragment < 0 or not (to.startswith("S") and to[1:].isascii() and to[1:].isdigit()):
        raise DdctlError(f"give a fragment >= 0 and a shard named S0, S1, ...; got fragment {fragment} and shard {to[:40]!r}")
    clients = {url: connect(url) for url in urls}
    started = time.perf_counter()
    begun = False  # whether a hand-out was asked for: only then is there a move to finish
    try:
        answers = {url: retry(clients[url].shards, give_up_after_s=30.0) for url in urls}
        routes = discover(urls, answers.__getitem__)
        newest = routes.map
        if newest is None:
            raise DdctlError(f"{urls[0]} is not sharded: there is no other shard to move a fragment to")
        if not 0 <= fragment < newest.fragments:
            raise DdctlError(f"fragment must be in [0, {newest.fragments}), got {fragment}")
        newest.index(to)
        target = routes.url_of_shard(to)
        own_view = shardmap.parse(answers[target]["map"])  # type: ignore[index]
        source = own_view.owner(fragment)
        if source == to:
            return {"fragment": fragment, "to": to, "moved": False, "epoch": own_view.epoch,
                    "reason": f"shard {to} owns fragment {fragment} already"}  # fmt: skip
        in_flight = newest.owner(fragment) == to  # the old owner handed it out; the new one has not taken it in
        epoch = newest.epoch if in_flight else newest.epoch + 1
        begun = True
        export = clients[routes.url_of_shard(source)].hand_out(fragment, to, epoch)
        answer = clients[target].hand_in(export)
    except Unavailable as exc:
        then = "run the same command again to finish the move" if begun else "no move was started, nothing changed"
        raise UnreachableError(f"a shard could not be reached: {exc}; {then}") from None
    finally:
        for client in clients.values():
            client.close()
    return {"fragment": fragment, "from": source, "to": to, "moved": True, "resumed": in_flight, "epoch": answer["epoch"],
            "version": answer.get("version"), "seconds": round(time.perf_counter() - started, 3)}  # fmt: skip
