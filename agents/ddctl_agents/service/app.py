"""The synchronizer's HTTP surface as a plain ASGI app (served by hypercorn over HTTP/2).

Each handler checks the token, bounds what it reads, and turns every refusal
into a status code with a JSON ``{"error", "reason"}`` body. Nothing a client
sends can take the service down: unexpected failures answer 500 and are
counted, and the next request is served as usual.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import struct
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from ddctl_agents.core.links import TransferMeter
from ddctl_agents.errors import AgentError, SyncError
from ddctl_agents.service.auth import ADMIN, Forbidden, check_identity, verify_token
from ddctl_agents.service.observability import metrics, status, vector_clock
from ddctl_agents.service.runtime import SyncerRuntime

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

STREAM_RECORD = struct.Struct("<Q")
"""Each record of the fragment stream: u64 length, then a wire frame (length 0: keep-alive)."""
MAX_JSON = 64 * 1024
log = logging.getLogger("ddctl.syncer")


class HttpError(Exception):
    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.code, self.reason = status, code, reason


class Disconnected(Exception):
    """The client went away mid-request."""


def _error_for(exc: Exception) -> HttpError:
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, SyncError):
        return HttpError(exc.status, exc.code, str(exc))
    status = getattr(exc, "status", 400)
    code = {401: "unauthorized", 403: "forbidden"}.get(status, "bad_request")
    return HttpError(status, code, str(exc))


class SyncerApp:
    """Routes requests to the runtime; see the module docstring."""

    def __init__(self, runtime: SyncerRuntime, secret: bytes) -> None:
        self.rt, self.secret = runtime, secret
        self.routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            ("GET", "/healthz"): self.healthz,
            ("GET", "/v1/job"): self.job,
            ("POST", "/v1/register"): self.register,
            ("POST", "/v1/leave"): self.leave,
            ("POST", "/v1/heartbeat"): self.heartbeat,
            ("POST", "/v1/updates"): self.push,
            ("GET", "/v1/fragments"): self.stream,
            ("GET", "/v1/vclock"): self.vclock,
            ("GET", "/v1/status"): self.status,
            ("GET", "/metrics"): self.metrics,
            ("POST", "/v1/snapshot"): self.snapshot,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._dispatch(scope, receive, send)
        except Disconnected:
            return
        except Exception as exc:  # every refusal becomes a response, never a crash
            error = _error_for(exc) if isinstance(exc, (AgentError, HttpError)) else None
            if error is None:
                log.exception("internal error on %s %s", scope["method"], scope["path"])
                error = HttpError(500, "internal", f"{type(exc).__name__}: {exc}")
            self.rt.rejections[error.status] = self.rt.rejections.get(error.status, 0) + 1
            try:
                await _json(send, error.status, {"error": error.code, "reason": error.reason})
            except Exception:  # the response had started or the client is gone: nothing left to tell
                log.debug("could not answer %s on %s", error.status, scope["path"])

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        handler = self.routes.get((method, path))
        if handler is None and method == "GET" and path.startswith("/v1/fragments/"):
            handler = self.fragment
        if handler is None:
            allowed = sorted(m for m, p in self.routes if p == path)
            if allowed:
                raise HttpError(405, "method_not_allowed", f"{path} allows {', '.join(allowed)}")
            raise HttpError(404, "not_found", f"no endpoint {path}")
        await handler(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.rt.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    raise
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.rt.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def identity(self, scope: Scope) -> str:
        return verify_token(self.secret, _header(scope, b"authorization"))

    # -- handlers -------------------------------------------------------------------------------
    async def healthz(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _json(send, 200, {"ok": True, "run": self.rt.settings.run})

    async def job(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.identity(scope)
        await _json(send, 200, {"run": self.rt.settings.run, "job": self.rt.job_json, "job_sha": self.rt.job_sha})

    async def register(self, scope: Scope, receive: Receive, send: Send) -> None:
        who = self.identity(scope)
        body = await _read_json(receive, scope)
        learner = self._own(who, _field(body, "learner", str))
        answer = await self.rt.register(
            learner, _field(body, "incarnation", int), _field(body, "region", str, default="", max_len=64)
        )
        await _json(send, 200, answer)

    async def leave(self, scope: Scope, receive: Receive, send: Send) -> None:
        who = self.identity(scope)
        body = await _read_json(receive, scope)
        learner = self._own(who, _field(body, "learner", str))
        await self.rt.leave(learner, _field(body, "reason", str, default="left", max_len=200))
        await _json(send, 200, {"left": learner})

    async def heartbeat(self, scope: Scope, receive: Receive, send: Send) -> None:
        who = self.identity(scope)
        body = await _read_json(receive, scope)
        learner = self._own(who, _field(body, "learner", str))
        report = {
            "step": _field(body, "step", int),
            "step_time": _field(body, "step_time", float),
            "tokens": _field(body, "tokens", int),
            "tokens_per_s": _field(body, "tokens_per_s", float),
            "loss": _field(body, "loss", float, default=None),
            "staleness": _field(body, "staleness", int, default=0),
            "due": _field(body, "due", list, default=[]),
            "rtt_s": _field(body, "rtt_s", float, default=None),
            "down_bytes": _field(body, "down_bytes", int, default=0),
            "down_seconds": _field(body, "down_seconds", float, default=0.0),
        }
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in report["due"]):
            raise HttpError(400, "bad_request", "field 'due' must be a list of non-negative integers")
        await _json(send, 200, await self.rt.heartbeat(learner, report))

    async def push(self, scope: Scope, receive: Receive, send: Send) -> None:
        who = self.identity(scope)
        if who == ADMIN:
            raise Forbidden("the admin identity cannot push updates")
        limit = self.rt.max_update_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise HttpError(413, "too_large", f"update of {declared} bytes exceeds the limit of {limit} bytes")
        fragment = _header(scope, b"x-ddctl-fragment")
        frag = int(fragment) if fragment and fragment.isdigit() and int(fragment) < self.rt.assembly.fragmentation.count else None
        expected = int(declared) if declared is not None else None
        meter = self.rt.meters.setdefault(who, TransferMeter())
        meter.start(self.rt.clock())
        reported = 0

        def on_chunk(received: int, chunk: int, done: bool) -> None:
            nonlocal reported
            meter.add(chunk, self.rt.clock())
            if done:
                sample = meter.finish(self.rt.clock())
                if sample is not None:
                    self.rt.observe_upload(who, *sample)
            if frag is not None and expected is not None and (done or received - reported >= 1 << 20):
                reported = received
                self.rt.inflight(who, frag, received, None if done else expected)

        body = await _read_body(receive, limit, on_chunk)
        update, ack = await self.rt.push(who, body)
        await _json(
            send,
            200,
            {
                "status": ack.status,
                "reason": ack.reason,
                "version": ack.version,
                "update_id": update.update_id,
                "bytes": len(body),
            },
        )

    async def fragment(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.identity(scope)
        raw = scope["path"].removeprefix("/v1/fragments/")
        count = self.rt.assembly.fragmentation.count
        if not raw.isdigit() or int(raw) >= count:
            raise HttpError(404, "not_found", f"fragment must be an integer in [0, {count}), got {raw!r}")
        since = _query_int(scope, "since", -1)
        item = self.rt.publisher.get(int(raw))
        if item is None or item.version <= since:
            await _respond(send, 304, b"", [])
            return
        self.rt.bytes_down += len(item.frame)
        await _respond(send, 200, item.frame, [(b"content-type", b"application/x-ddctl-frame")])

    async def stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Newest versions of every fragment the client has not seen, as they are made."""
        self.identity(scope)
        count = self.rt.assembly.fragmentation.count
        raw = parse_qs(scope.get("query_string", b"").decode()).get("since", [""])[0]
        try:
            since = [int(x) for x in raw.split(",")] if raw else [-1] * count
        except ValueError:
            raise HttpError(400, "bad_request", "since must be comma-separated integers, one per fragment") from None
        if len(since) != count:
            raise HttpError(400, "bad_request", f"since must list {count} versions, got {len(since)}")
        await _read_body(receive, MAX_JSON)  # a GET's (empty) body; what receive() says next is the disconnect
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/x-ddctl-stream")]})
        disconnected = asyncio.ensure_future(receive())
        try:
            async for item in self.rt.publisher.follow(since, self.rt.settings.keepalive_s):
                if disconnected.done():
                    return
                frame = b"" if item is None else item.frame
                await send({"type": "http.response.body", "body": STREAM_RECORD.pack(len(frame)) + frame, "more_body": True})
                self.rt.bytes_down += len(frame)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            disconnected.cancel()

    async def vclock(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.identity(scope)
        await _json(send, 200, await self.rt.view(vector_clock))

    async def status(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.identity(scope)
        await _json(send, 200, await self.rt.view(status))

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.identity(scope)
        text = await self.rt.view(metrics)
        await _respond(send, 200, text.encode(), [(b"content-type", b"text/plain; version=0.0.4")])

    async def snapshot(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.identity(scope) != ADMIN:
            raise Forbidden("only the admin identity may trigger snapshots")
        await _json(send, 200, await self.rt.snapshot())

    def _own(self, who: str, learner: str) -> str:
        check = _checked_identity(learner)
        if who != check:
            raise Forbidden(f"token is for {who!r}, not for learner {learner!r}")
        return check


# -- plumbing -----------------------------------------------------------------------------------
def _checked_identity(name: str) -> str:
    try:
        return check_identity(name)
    except ValueError as exc:
        raise HttpError(400, "bad_request", str(exc)) from None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _query_int(scope: Scope, key: str, default: int) -> int:
    raw = parse_qs(scope.get("query_string", b"").decode()).get(key)
    if not raw:
        return default
    try:
        return int(raw[0])
    except ValueError:
        raise HttpError(400, "bad_request", f"query parameter {key!r} must be an integer") from None


async def _read_body(receive: Receive, limit: int, on_chunk: Callable[[int, int, bool], None] | None = None) -> bytes:
    """The whole request body, refusing it (413) once it passes ``limit``.

    ``on_chunk(received so far, chunk length, done)`` sees every chunk, and once
    more with ``done`` when the body ends, is refused or the client goes away.
    """
    body = bytearray()
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Disconnected
            chunk = message.get("body", b"")
            if len(body) + len(chunk) > limit:
                raise HttpError(413, "too_large", f"body exceeds the limit of {limit} bytes")
            body += chunk
            if on_chunk is not None:
                on_chunk(len(body), len(chunk), False)
            if not message.get("more_body", False):
                return bytes(body)
    finally:
        if on_chunk is not None:
            on_chunk(len(body), 0, True)


async def _read_json(receive: Receive, scope: Scope) -> dict[str, Any]:
    raw = await _read_body(receive, MAX_JSON)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HttpError(400, "bad_request", f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HttpError(400, "bad_request", "body must be a JSON object")
    return body


_MISSING = object()


def _field(body: dict[str, Any], key: str, kind: type, default: Any = _MISSING, max_len: int = 64) -> Any:
    value = body.get(key, default)
    if value is _MISSING:
        raise HttpError(400, "bad_request", f"field {key!r} is required")
    if value is None and default is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise HttpError(400, "bad_request", f"field {key!r} must be {kind.__name__}, got {type(value).__name__}")
    if isinstance(value, (int, float)) and (value < 0 or (isinstance(value, float) and not math.isfinite(value))):
        raise HttpError(400, "bad_request", f"field {key!r} must be a finite non-negative number, got {value!r}")
    if isinstance(value, (str, list)) and len(value) > (max_len if isinstance(value, str) else 4096):
        raise HttpError(400, "bad_request", f"field {key!r} is too long")
    return value


async def _json(send: Send, status: int, body: Any) -> None:
    await _respond(send, status, json.dumps(body, allow_nan=False).encode(), [(b"content-type", b"application/json")])


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
