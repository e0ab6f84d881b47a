"""The synchronizer's HTTP surface as a plain ASGI app (served by hypercorn over HTTP/2).

Each handler checks the token, bounds what it reads, and turns every refusal
into a status code with a JSON ``{"error", "reason"}`` body. Nothing a client
sends can take the service down: unexpected failures answer 500 and are
counted, and the next request is served as usual.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

from ddctl_agents import tcpinfo
from ddctl_agents.core.links import DeliveryMeter, TransferMeter
from ddctl_agents.core.shardmap import refuse_unless_owned
from ddctl_agents.errors import (
    REJECTIONS,
    BadRequest,
    Forbidden,
    MethodNotAllowed,
    NotFound,
    TooLarge,
)
from ddctl_agents.relay import address, region_of
from ddctl_agents.service import cuts, h2tuning, handoffs, history
from ddctl_agents.service.asgi import (
    Handler,
    Receive,
    Scope,
    Send,
    answer_errors,
    header,
    json_response,
    read_body,
    respond,
    stream_records,
)
from ddctl_agents.service.auth import ADMIN, verify_token
from ddctl_agents.service.ending import stop_job
from ddctl_agents.service.metrics import metrics
from ddctl_agents.service.observability import health, status, vector_clock
from ddctl_agents.service.requests import (
    CutBody,
    HandoffBody,
    HeartbeatBody,
    LeaveBody,
    ReadmitBody,
    RegisterBody,
    StopBody,
    parse_body,
    parse_count,
    parse_query,
    parse_versions,
)
from ddctl_agents.service.runtime import SyncerRuntime
from ddctl_agents.train.modelfiles import pack

"""Each record of the fragment stream: u64 length, then a wire frame (length 0: keep-alive)."""
MAX_JSON = 64 * 1024
log = logging.getLogger(__name__)


class SyncerApp:
    """Routes requests to the runtime; see the module docstring."""

    def __init__(self, runtime: SyncerRuntime, secret: bytes) -> None:
        self.rt, self.secret = runtime, secret
        self.model_files = pack(runtime.assembly.model_dir)
        """The source of the job's own model, which learners (having no job directory) get with the job."""
        self.routes: dict[tuple[str, str], Handler] = {
            ("GET", "/healthz"): self.healthz,
            ("GET", "/v1/job"): self.job,
            ("POST", "/v1/register"): self.register,
            ("POST", "/v1/leave"): self.leave,
            ("POST", "/v1/heartbeat"): self.heartbeat,
            ("POST", "/v1/updates"): self.push,
            ("GET", "/v1/fragments"): self.stream,
            ("GET", "/v1/vclock"): self.vclock,
            ("GET", "/v1/shards"): self.shards,
            ("GET", "/v1/relay"): self.relay,
            ("GET", "/v1/status"): self.status,
            ("GET", "/metrics"): self.metrics,
            ("POST", "/v1/snapshot"): self.snapshot,
            ("POST", "/v1/admin/readmit"): self.readmit,
            ("POST", "/v1/admin/stop"): self.stop,
            ("POST", "/v1/admin/cut"): self.cut,
            ("POST", "/v1/admin/handoff/out"): self.handoff_out,
            ("POST", "/v1/admin/handoff/in"): self.handoff_in,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        await answer_errors(scope, receive, send, self._dispatch, self._count_refusal)

    def _count_refusal(self, status: int) -> None:
        self.rt.rejections[status] = self.rt.rejections.get(status, 0) + 1

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        handler = self.routes.get((method, path))
        if handler is None and method == "GET" and path.startswith("/v1/fragments/"):
            handler = self.fragment
        if handler is None and method == "GET" and path.startswith("/v1/admin/cuts/"):
            handler = self.cut_file
        if handler is None:
            allowed = sorted(m for m, p in self.routes if p == path)
            if allowed:
                raise MethodNotAllowed(f"{path} allows {', '.join(allowed)}")
            raise NotFound(f"no endpoint {path}")
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
        return verify_token(self.secret, header(scope, b"authorization"))

    # -- handlers -------------------------------------------------------------------------------
    async def healthz(self, scope: Scope, receive: Receive, send: Send) -> None:
        await json_response(send, 200, await self.rt.view(health))

    async def job(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.identity(scope)
        answer: dict[str, Any] = {"run": self.rt.settings.run, "job": self.rt.job_json, "job_sha": self.rt.job_sha}
        await json_response(send, 200, answer | ({"model_files": self.model_files} if self.model_files else {}))

    async def register(self, scope: Scope, receive: Receive, send: Send) -> None:
        who = self.identity(scope)
        body = parse_body(RegisterBody, await read_body(receive, MAX_JSON))
        self._own(who, body.learner)
        await json_response(send, 200, await self.rt.register(body.learner, body.incarnation, body.region, body.cadence))

    async def leave(self, scope: Scope, receive: Receive, send: Send) -> None:
        who = self.identity(scope)
        body = parse_body(LeaveBody, await read_body(receive, MAX_JSON))
        self._own(who, body.learner)
        await self.rt.leave(body.learner, body.reason, body.tokens)
        await json_response(send, 200, {"left": body.learner})

    async def heartbeat(self, scope: Scope, receive: Receive, send: Send) -> None:
        who = self.identity(scope)
        history.check(header(scope, history.HEADER), self.rt.publisher.history, "heartbeat")  # steps of another life
        body = parse_body(HeartbeatBody, await read_body(receive, MAX_JSON))
        self._own(who, body.learner)
        await json_response(send, 200, await self.rt.heartbeat(body))

    async def push(self, scope: Scope, receive: Receive, send: Send) -> None:
        who = self.identity(scope)
        if who == ADMIN:
            raise Forbidden("the admin identity cannot push updates")
        limit = self.rt.max_update_bytes
        declared = header(scope, b"content-length")
        expected = None if declared is None else parse_count(declared, "content-length")
        if expected is not None and expected > limit:
            raise TooLarge(f"update of {declared} bytes exceeds the limit of {limit} bytes")
        fragment = header(scope, b"x-ddctl-fragment")
        count = self.rt.assembly.fragmentation.count
        frag = None if fragment is None else parse_count(fragment, "header x-ddctl-fragment", maximum=count - 1)
        if frag is not None:
            refuse_unless_owned(self.rt.role, frag)  # before the body: a misrouted upload costs its headers
        history.check(header(scope, history.HEADER), self.rt.publisher.history)  # before the body, too
        meter = self.rt.meters.setdefault(who, TransferMeter())
        meter.start(self.rt.clock())
        reported = 0

        def on_chunk(received: int, chunk: int, done: bool) -> None:
            nonlocal reported
            meter.add(chunk, self.rt.clock())
            if done:
                sample = meter.finish(self.rt.clock())
                if sample is not None:
                    self.rt.observe_link(who, "up", *sample)  # timed here: used until the learner's kernel reports
            if frag is not None and expected is not None and (done or received - reported >= 1 << 20):
                reported = received
                self.rt.inflight(who, frag, received, None if done else expected)

        body = await read_body(receive, limit, on_chunk)
        update, ack = await self.rt.push(who, body, frag)
        if ack.status == "rejected":
            raise REJECTIONS[ack.code](ack.reason)
        await json_response(
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

    async def shards(self, scope: Scope, receive: Receive, send: Send) -> None:
        """This shard's name and the newest shard map it knows (both null: one synchronizer owns every fragment)."""
        self.identity(scope)
        role = self.rt.role
        answer = {"shard": None, "map": None} if role is None else {"shard": role.name, "map": role.map.to_json()}
        await json_response(send, 200, answer)

    async def fragment(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.identity(scope)
        raw = scope["path"].removeprefix("/v1/fragments/")
        count = self.rt.assembly.fragmentation.count
        try:
            fragment = parse_count(raw, "fragment", maximum=count - 1)
        except BadRequest:
            raise NotFound(f"fragment must be an integer in [0, {count}), got {raw!r:.40}") from None
        query = parse_query(scope.get("query_string", b""))
        since = parse_count(query.get("since", "-1"), "query parameter 'since'", minimum=-1)
        item = self.rt.publisher.get(fragment)
        if item is None or item.version <= since:
            await respond(send, 304, b"", [])
            return
        self.rt.bytes_down += len(whole := await item.whole())
        await respond(send, 200, whole, [(b"content-type", b"application/x-ddctl-frame")])

    async def stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Newest versions of every fragment the client has not seen, as they are made.

        The subscriber's downlink is measured here, by this side's kernel: before each record
        the connection's TCP_INFO counters are read, and ``DeliveryMeter`` turns the bytes
        acknowledged over busy time between idle moments into samples. The site's meter takes
        each window on its own, placed where its last byte was acknowledged: read before the
        next record, a window is read up to a round (or a keep-alive) after it ended."""
        who = self.identity(scope)
        count = self.rt.assembly.fragmentation.count
        query = parse_query(scope.get("query_string", b""))
        since, deltas = parse_versions(query.get("since", ""), count), query.get("deltas") == "1"  # it can step versions
        await read_body(receive, MAX_JSON)  # a GET's (empty) body; what receive() says next is the disconnect
        chain = self.rt.publisher.chain.encode()  # a subscriber's deltas step from its versions only if they are of this chain
        headers = [(b"content-type", b"application/x-ddctl-stream"), (b"x-ddctl-chain", chain)]
        headers.append((history.HEADER, self.rt.publisher.history.encode()))  # which history its version numbers count in
        sock, meter = h2tuning.connection_socket(scope), DeliveryMeter()

        def measure() -> None:  # pooled samples for the learner's rate, each window where it fell for the site's
            if sock is not None and (sample := meter.read(tcpinfo.sending(sock))) is not None:
                self.rt.observe_link(who, "down", *sample, kernel=True, site=False)
            if (window := meter.closed) is not None:
                self.rt.observe_link(who, "down", window.nbytes, window.seconds, True, rate=False, ended_ago=window.ended_ago)

        relay, streams = region_of(who), self.rt.streams  # a region's relay: shown by its region on /v1/status
        at = relay_at(relay, query.get("at", ""))

        async def records() -> AsyncIterator[bytes]:
            held = functools.partial(self.rt.holds.wants, who) if self.rt.holds.held(who) else None
            sent = list(since) if deltas and query.get("chain") == chain.decode() else [-1] * count  # what it holds
            async for item in self.rt.publisher.follow(since, self.rt.settings.keepalive_s, held):
                if item is not None:
                    self.rt.holds.sent(who, item.fragment)
                frame = b"" if item is None else await item.frame_for(sent[item.fragment], rounded=held is not None)
                if item is not None and deltas:
                    sent[item.fragment] = item.version
                yield frame
                self.rt.bytes_down += len(frame)
                if relay is not None:
                    streams.sent(relay, len(frame), self.rt.clock())

        if relay is not None:
            streams.opened(relay, self.rt.clock(), at)
        streams.direct[who] += relay is None  # a learner reading here is not behind its relay
        try:
            await stream_records(receive, send, headers, records(), measure)
        finally:
            if relay is not None:
                streams.closed(relay, self.rt.clock())
            streams.direct[who] -= relay is None

    async def relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Where the caller's region's relay is now ("" while none streams from here): a learner whose relay stopped
        answering asks, and finds one whose host was replaced at another address."""
        region = self.rt.roster.region_of(self.identity(scope))
        if not region:
            raise NotFound("this learner has not registered here: register first, then ask for its region's relay")
        await json_response(send, 200, {"region": region, "address": self.rt.streams.located(region)})

    async def vclock(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.identity(scope)
        await json_response(send, 200, await self.rt.view(vector_clock))

    async def status(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.identity(scope)
        await json_response(send, 200, await self.rt.view(status))

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.identity(scope)
        text = await self.rt.view(metrics)
        await respond(send, 200, text.encode(), [(b"content-type", b"text/plain; version=0.0.4")])

    async def snapshot(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.identity(scope) != ADMIN:
            raise Forbidden("only the admin identity may trigger snapshots")
        await json_response(send, 200, await self.rt.snapshot())

    async def readmit(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The operator lets a suspended learner back in (``ddctl syncer readmit``); it then registers again."""
        if self.identity(scope) != ADMIN:
            raise Forbidden("only the admin identity may readmit a learner")
        body = parse_body(ReadmitBody, await read_body(receive, MAX_JSON))
        readmitted = await self.rt.readmit(body.learner)
        reason = "readmitted; it registers again on its own" if readmitted else "was not suspended; nothing to do"
        await json_response(send, 200, {"learner": body.learner, "readmitted": readmitted, "reason": reason})

    async def stop(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The operator ends the job (``ddctl stop``): learners stop, the last rounds close, the result is written."""
        if self.identity(scope) != ADMIN:
            raise Forbidden("only the admin identity may stop the job")
        body = parse_body(StopBody, await read_body(receive, MAX_JSON))
        await json_response(send, 200, await stop_job(self.rt, body.reason))

    async def cut(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A global checkpoint's marker (``ddctl syncer checkpoint``): this shard's part, once it is on disk."""
        if self.identity(scope) != ADMIN:
            raise Forbidden("only the admin identity may take a global checkpoint")
        body = parse_body(CutBody, await read_body(receive, MAX_JSON))
        await json_response(send, 200, await cuts.marker(self.rt, body.epoch))

    async def cut_file(self, scope: Scope, receive: Receive, send: Send) -> None:
        """GET /v1/admin/cuts/{epoch}/{file}: one file of this shard's part of a global checkpoint."""
        if self.identity(scope) != ADMIN:
            raise Forbidden("only the admin identity may read a global checkpoint's parts")
        epoch, _, name = scope["path"].removeprefix("/v1/admin/cuts/").partition("/")
        data = cuts.part_file(self.rt, parse_count(epoch, "checkpoint epoch", minimum=1), name)
        await respond(send, 200, data, [(b"content-type", b"application/octet-stream")])

    async def handoff_out(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Give a fragment to another shard (``ddctl syncer move``); the export, once the handoff is logged here."""
        if self.identity(scope) != ADMIN:
            raise Forbidden("only the admin identity may move fragments")
        body = parse_body(HandoffBody, await read_body(receive, MAX_JSON))
        data = await handoffs.hand_out(self.rt, body.fragment, body.to, body.epoch)
        await respond(send, 200, data, [(b"content-type", b"application/x-ddctl-frame")])

    async def handoff_in(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Take a fragment another shard exported (its values, buffer, version and recent update ids)."""
        if self.identity(scope) != ADMIN:
            raise Forbidden("only the admin identity may move fragments")
        data = await read_body(receive, 2 * self.rt.max_update_bytes)
        await json_response(send, 200, await handoffs.hand_in(self.rt, data))

    def _own(self, who: str, learner: str) -> None:
        if who != learner:
            raise Forbidden(f"token is for {who!r}, not for learner {learner!r}")


def relay_at(relay: str | None, at: str) -> str:
    """The address a relay's stream says its learners reach it at (``relay.address``), checked; only a relay says one."""
    if not at:
        return ""
    if relay is None:
        raise BadRequest("at= is a relay's address: only a region's relay (identity relay-REGION) gives one")
    try:
        return address(at)
    except ValueError as exc:
        raise BadRequest(f"at=: {exc}") from None
