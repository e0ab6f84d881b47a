"""ASGI plumbing shared by the synchronizer's app and a region's relay: reading, answering, streaming, refusing.

Both speak the same protocol to learners (the relay serves the synchronizer's
fragment stream), so the bounded body reader, the stream's record framing and
the rule that every refusal is a JSON answer and never a crash live here once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ddctl_agents.errors import AgentError, ClientGone, TooLarge

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

STREAM_RECORD = struct.Struct("<Q")
"""Each record of a fragment stream is its frame's length, then the frame; an empty record is a keep-alive."""
log = logging.getLogger(__name__)


async def answer_errors(scope: Scope, receive: Receive, send: Send, handler: Handler, counted: Callable[[int], None]) -> None:
    """Run ``handler``; a refusal becomes its status with ``{"error", "reason"}``, anything else a counted 500."""
    try:
        await handler(scope, receive, send)
    except ClientGone:
        return
    except Exception as exc:  # every refusal becomes a response, never a crash
        details: dict[str, Any] = {}
        if isinstance(exc, AgentError):
            status, code, reason = exc.status, exc.code, str(exc)
            details = getattr(exc, "details", {})
        else:
            log.exception("internal error on %s %s", scope["method"], scope["path"])
            status, code, reason = 500, "internal", f"{type(exc).__name__}: {exc}"
        counted(status)
        try:
            await json_response(send, status, {**details, "error": code, "reason": reason})
        except Exception:  # the response had started or the client is gone: nothing left to tell
            log.debug("could not answer %s on %s", status, scope["path"])


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def read_body(receive: Receive, limit: int, on_chunk: Callable[[int, int, bool], None] | None = None) -> bytes:
    """The whole request body, refusing it (413) once it passes ``limit``.

    ``on_chunk(received so far, chunk length, done)`` sees every chunk, and once
    more with ``done`` when the body ends, is refused or the client goes away.
    """
    body = bytearray()
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone("the client went away")
            chunk = message.get("body", b"")
            if len(body) + len(chunk) > limit:
                raise TooLarge(f"body exceeds the limit of {limit} bytes")
            body += chunk
            if on_chunk is not None:
                on_chunk(len(body), len(chunk), False)
            if not message.get("more_body", False):
                return bytes(body)
    finally:
        if on_chunk is not None:
            on_chunk(len(body), 0, True)


async def json_response(send: Send, status: int, body: Any) -> None:
    await respond(send, status, json.dumps(body, allow_nan=False).encode(), [(b"content-type", b"application/json")])


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def stream_records(
    receive: Receive, send: Send, headers: list[tuple[bytes, bytes]], records: AsyncIterator[bytes], before: Callable[[], None]
) -> None:
    """Answer 200 and send each of ``records`` framed (``STREAM_RECORD``), ``before()`` ahead of each, until they end.

    A subscriber that goes away ends the stream at once, not at the next keep-alive: thousands of cancelled
    subscriptions must not pile up waiting (the fuzz suite measured them in memory)."""
    await send({"type": "http.response.start", "status": 200, "headers": headers})

    async def pump() -> None:
        async for frame in records:
            before()
            await send({"type": "http.response.body", "body": STREAM_RECORD.pack(len(frame)) + frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    disconnected, pumping = asyncio.ensure_future(receive()), asyncio.ensure_future(pump())
    try:
        await asyncio.wait({disconnected, pumping}, return_when=asyncio.FIRST_COMPLETED)
        if pumping.done():
            pumping.result()
    finally:
        disconnected.cancel()
        pumping.cancel()
        await asyncio.gather(disconnected, pumping, return_exceptions=True)
