"""The relay's HTTP surface: the synchronizer's fragment stream, served to one region's learners.

A learner asks the relay exactly as it asks a shard (``GET /v1/fragments?since=``)
and reads the same records, so the learner's client and the service's stream
plumbing (``service/asgi``, ``service/publisher``) serve both. Tokens are the
region's (``auth.relay_key``); the versions are whole (no delta chains), and a
relay that has lost a shard refuses (503) or ends its streams, which sends its
learners to the shards until it recovers. Its streams list each shard's history
(``history.LISTED``) and end when a shard started over, so its learners learn it
as if they read the shards themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ddctl_agents.errors import MethodNotAllowed, NotFound, UpstreamDown
from ddctl_agents.relay.feed import Feed
from ddctl_agents.service import history
from ddctl_agents.service.asgi import (
    Handler,
    Receive,
    Scope,
    Send,
    answer_errors,
    header,
    json_response,
    read_body,
    stream_records,
)
from ddctl_agents.service.auth import verify_token
from ddctl_agents.service.requests import parse_query, parse_versions

MAX_GET_BODY = 1024


class RelayApp:
    def __init__(self, feed: Feed, key: bytes, region: str, keepalive_s: float) -> None:
        self.feed, self.key, self.region, self.keepalive_s = feed, key, region, keepalive_s
        self.bytes_out = 0
        """Version bytes sent to the region's learners (what they would have pulled across the region's link)."""
        self.subscribers = 0
        self.refusals: dict[int, int] = {}
        self.routes: dict[tuple[str, str], Handler] = {("GET", "/healthz"): self.healthz, ("GET", "/v1/fragments"): self.stream}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await answer_errors(scope, receive, send, self._dispatch, self._count_refusal)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """The feed starts with the server (it publishes into the server's loop) and stops with it."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.feed.start(asyncio.get_running_loop())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.feed.stop()
                await self.feed.publisher.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _count_refusal(self, status: int) -> None:
        self.refusals[status] = self.refusals.get(status, 0) + 1

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.routes.get((scope["method"], scope["path"]))
        if handler is None:
            if any(p == scope["path"] for _, p in self.routes):
                raise MethodNotAllowed(f"{scope['path']} allows GET")
            raise NotFound(f"no endpoint {scope['path']} on a relay (it serves /v1/fragments and /healthz)")
        await handler(scope, receive, send)

    async def healthz(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Whether the relay serves (``stale``: why not), and its byte counters both ways."""
        counts = self.feed.counts
        answer: dict[str, Any] = {"relay": self.region, "stale": self.feed.stale(), "subscribers": self.subscribers}
        answer |= {"frames_in": counts.frames, "bytes_in": counts.bytes_in, "refused_in": counts.refused}
        await json_response(send, 200, answer | {"bytes_out": self.bytes_out, "refusals": self.refusals})

    async def stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every version newer than ``since``, as the feed brings it; the stream ends if the feed goes stale, or forgets
        what it held (a shard started over)."""
        verify_token(self.key, header(scope, b"authorization"))
        since = parse_versions(parse_query(scope.get("query_string", b"")).get("since", ""), self.feed.fragments)
        await read_body(receive, MAX_GET_BODY)
        if reason := self.feed.stale():
            raise UpstreamDown(f"relay {self.region}: {reason}; pull from the shards")

        async def records() -> AsyncIterator[bytes]:
            async for item in self.feed.publisher.follow(since, self.keepalive_s):
                if self.feed.stale():
                    return
                frame = b"" if item is None else item.frame
                yield frame
                self.bytes_out += len(frame)

        self.subscribers += 1
        try:
            listed = history.listing(self.feed.histories).encode()
            headers = [(b"content-type", b"application/x-ddctl-stream"), (history.LISTED, listed)]
            await stream_records(receive, send, headers, records(), lambda: None)
        finally:
            self.subscribers -= 1
