"""A typed HTTP/2 client for the synchronizer service (httpx).

Refusals (4xx) raise ``Refused`` with the service's stable error code; anything
worth retrying (no connection, timeouts, 5xx) raises ``Unavailable``, and
``retry`` retries it with capped, jittered exponential backoff. Uploads stream
the body in 256 KiB chunks (one HTTP/2 frame each with our server's frame
size): httpcore re-slices a large ``bytes`` body for every frame, which made
one 64 MiB body crawl at about 1 MB/s.
"""

from __future__ import annotations

import functools
import ssl
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from ddctl_agents import relay, tcpinfo, waiting
from ddctl_agents.core.links import SendCounters
from ddctl_agents.core.text import printable
from ddctl_agents.errors import ConfigError, Refused, Unavailable
from ddctl_agents.service import history

T = TypeVar("T")
__all__ = ["Refused", "SyncerClient", "Unavailable", "retry"]
CHUNK = 256 * 1024
KEEPALIVE_S = 60.0
"""How long an idle connection is kept (httpx's default is 5 s; the syncer keeps them 120 s). An uploader often
waits longer than 5 s for its next update, and a new connection per upload cost a TLS handshake each time."""
STREAM_RECORD = struct.Struct("<Q")
MOST_FRAME_BYTES = 20 + (1 << 20) + (1 << 31) + 4
"""The largest frame a learner or relay decodes (``core/wire.py``: prefix, header and payload at ``DEFAULT_LIMITS``,
CRC): a stream record that declares more is refused before it is buffered (kept equal by a test; wire imports torch,
this module must not)."""
MOST_ANSWER_BYTES = 32 << 20
"""What any answer but a fragment's handoff may be: a job with its model's source (at most 4 MiB) or a status of
thousands of learners fits many times over."""


def retry(call: Callable[[], T], *, stop: Callable[[], bool] = lambda: False, give_up_after_s: float = float("inf")) -> T:
    """``call()`` until it does not raise Unavailable; backoff 0.1 s doubling to 5 s, with jitter."""
    return waiting.retry(call, retry_on=(Unavailable,), stop=stop, give_up_after_s=give_up_after_s)


def _pinned(ca: Path) -> ssl.SSLContext:
    """A TLS context trusting only the job's CA; a file that is missing or not a certificate is named at once."""
    try:
        return ssl.create_default_context(cafile=str(ca))
    except OSError as exc:  # ssl.SSLError is one: not PEM, or no certificate in it
        raise ConfigError(f"the CA certificate {ca}: {exc.strerror or exc}") from None


class SyncerClient:
    """One HTTP/2 connection to the syncer, authenticated as one identity."""

    def __init__(
        self, url: str, token: str, ca: Path | None = None, timeout_s: float = 30.0, http2: bool = True, server_name: str = ""
    ) -> None:
        """``server_name``: the name the server's certificate must carry, whatever address ``url`` names (a relay's)."""
        self.url = url.rstrip("/")
        self.extensions = {"sni_hostname": server_name} if server_name else {}
        tls = self.url.startswith("https://")
        if not tls and not self.url.startswith("http://"):
            raise ConfigError(f"syncer URL must start with https:// or http://, got {url!r}")
        verify: ssl.SSLContext | bool = _pinned(ca) if tls and ca else tls
        self._http = functools.partial(
            httpx.Client,
            http1=tls or not http2,  # with TLS, ALPN picks h2; in plain text, HTTP/2 prior knowledge (h2c)
            http2=http2,
            verify=verify,
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            headers={"authorization": f"Bearer {token}"},
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),
        )
        self.http = self._http()
        self._stream: Any = None
        """The connection the last response came on (httpcore's network stream), for ``sending``."""

    def close(self) -> None:
        self.http.close()

    def sending(self) -> SendCounters | None:
        """The kernel's counters for the sending side of the connection the last response came on.

        None before any response, off Linux, or once that connection has closed. An upload is
        measured by reading them before and after it (``core.links.sent_between``)."""
        return tcpinfo.sending(self._stream.get_extra_info("socket")) if self._stream is not None else None

    # -- calls ----------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._json("GET", "/healthz")

    def job(self) -> dict[str, Any]:
        return self._json("GET", "/v1/job")

    def register(self, learner: str, incarnation: int, region: str, cadence: int = 1) -> dict[str, Any]:
        body = {"learner": learner, "incarnation": incarnation, "region": region, "cadence": cadence}
        return self._json("POST", "/v1/register", json=body)

    def leave(self, learner: str, reason: str = "left", tokens: int | None = None) -> dict[str, Any]:
        """Goodbye, with why and (when known) the tokens this life trained in all."""
        body: dict[str, Any] = {"learner": learner, "reason": reason}
        if tokens is not None:
            body["tokens"] = tokens
        return self._json("POST", "/v1/leave", json=body)

    def heartbeat(self, report: dict[str, Any], based_in: str = "") -> dict[str, Any]:
        """Progress in (``based_in`` as for ``push``: a heartbeat of another history is refused, not counted)."""
        headers = {history.HEADER.decode(): based_in} if based_in else {}
        return self._json("POST", "/v1/heartbeat", json=report, headers=headers)

    def shards(self) -> dict[str, Any] | None:
        """This shard's name and its shard map; None from a synchronizer that is not sharded."""
        answer = self._json("GET", "/v1/shards")
        return None if answer.get("shard") is None and answer.get("map") is None else answer

    def status(self) -> dict[str, Any]:
        return self._json("GET", "/v1/status")

    def stop_job(self, reason: str) -> dict[str, Any]:
        """Admin only: end the job now (learners push and leave, the result is written, the syncer exits)."""
        return self._json("POST", "/v1/admin/stop", json={"reason": reason})

    def readmit(self, learner: str) -> dict[str, Any]:
        """Admin only: let a suspended learner back in."""
        return self._json("POST", "/v1/admin/readmit", json={"learner": learner})

    def cut(self, epoch: int) -> dict[str, Any]:
        """Admin only: a global checkpoint's marker to this shard; its part's manifest, once the part is on its disk."""
        return self._json("POST", "/v1/admin/cut", json={"epoch": epoch})

    def cut_file(self, epoch: int, name: str, limit: int) -> bytes:
        """Admin only: one file of this shard's part of checkpoint ``epoch`` (refused past ``limit`` bytes)."""
        data = bytearray()
        try:
            with self.http.stream("GET", f"{self.url}/v1/admin/cuts/{epoch}/{name}", extensions=self.extensions) as r:
                _raise_for(r, r.read() if r.status_code >= 400 else b"")
                for chunk in r.iter_bytes():
                    data += chunk
                    if len(data) > limit:
                        raise Unavailable(f"{name} of checkpoint {epoch} from {self.url} is over the {limit} bytes expected")
        except httpx.TransportError as exc:
            raise Unavailable(f"GET {name} of checkpoint {epoch} on {self.url}: {exc!r}") from None
        return bytes(data)

    def hand_out(self, fragment: int, to: str, epoch: int) -> bytes:
        """Admin only: this shard gives ``fragment`` to shard ``to`` at map epoch ``epoch``; the export."""
        asked = {"fragment": fragment, "to": to, "epoch": epoch}
        return self._request("POST", "/v1/admin/handoff/out", MOST_FRAME_BYTES, json=asked).content

    def hand_in(self, export: bytes) -> dict[str, Any]:
        """Admin only: this shard takes the fragment another exported."""
        return self._json("POST", "/v1/admin/handoff/in", content=export, headers={"content-type": "application/x-ddctl-frame"})

    def relay_address(self) -> str:
        """Where this learner's region's relay is now, as it told this shard ("" while none streams from it)."""
        answer = self._json("GET", "/v1/relay").get("address")
        try:
            return relay.address(answer) if answer else ""
        except ValueError as exc:
            raise Unavailable(f"GET /v1/relay on {self.url}: {exc}") from None

    def metrics(self) -> str:
        return self._request("GET", "/metrics").text

    def push(self, frame: bytes, fragment: int, based_in: str = "") -> dict[str, Any]:
        """Upload one update frame, streamed in chunks; the answer is the syncer's ack.

        ``based_in``: the history its base versions count in (``service/history.py``), where the shard's stream named
        one; the shard refuses the update if it is not its own."""

        def chunks() -> Iterator[bytes]:
            view = memoryview(frame)
            for i in range(0, len(view), CHUNK):
                yield bytes(view[i : i + CHUNK])

        headers = {
            "content-length": str(len(frame)),
            "x-ddctl-fragment": str(fragment),
            "content-type": "application/x-ddctl-frame",
        } | ({history.HEADER.decode(): based_in} if based_in else {})
        return self._json("POST", "/v1/updates", content=chunks(), headers=headers)

    def fragments(
        self,
        since: list[int],
        chain: list[str] | None = None,
        at: str = "",
        opened: Callable[[str], None] | None = None,
        listed: Callable[[str], None] | None = None,
    ) -> Iterator[bytes]:
        """The subscription stream, frame by frame; empty frames are keep-alives.

        With ``chain`` the stream may send versions as deltas (``core/version_delta.py``) from those in ``since``
        when they are of the chain named in ``chain[0]``; the stream's own chain is put there when it opens.

        Nothing is timed here: a reading thread that wakes late finds a whole frame
        waiting and would time its own wake-up (a 50 Mbit/s link read 655-801). The
        syncer measures each learner's downlink from its own socket (``tcpinfo``).

        ``at``: a relay's address, which it tells the shards its stream comes from (``relay.address``).

        ``opened``: called as the stream opens, with the history its versions count in (``service/history.py``; "" where
        the server names none), before any frame is read. ``listed``: called then with a relay's list of its shards'
        histories (``history.LISTED``; "" where none is named). Either may raise to refuse the stream.

        Left early (the caller breaks out), the stream ends at the server too: httpcore closes an HTTP/2 response
        without a RST_STREAM, so the server would go on feeding a stream nobody reads until its window filled, and
        count it (a learner behind its relay went on counting as reading a shard itself, for 20 s and more). This
        client's connections are dropped instead, which ends every stream on them: give a stream a client of its
        own."""
        params = {"since": ",".join(str(v) for v in since)} | ({"at": at} if at else {})
        if chain is not None:
            params.update(deltas="1", chain=chain[0])
        try:
            timeout = httpx.Timeout(60.0, connect=5.0)
            with self.http.stream(
                "GET", f"{self.url}/v1/fragments", params=params, timeout=timeout, extensions=self.extensions
            ) as r:
                _raise_for(r, r.read() if r.status_code >= 400 else b"")
                if chain is not None:
                    chain[0] = r.headers.get("x-ddctl-chain", "")
                try:
                    if opened is not None:
                        opened(r.headers.get(history.HEADER.decode(), ""))
                    if listed is not None:
                        listed(r.headers.get(history.LISTED.decode(), ""))
                except Exception:  # the caller refuses the stream as it opens: it ends at the server too (see above)
                    self._drop()
                    raise
                buffer = bytearray()
                for chunk in r.iter_raw():
                    buffer += chunk
                    while len(buffer) >= STREAM_RECORD.size:
                        (size,) = STREAM_RECORD.unpack_from(buffer)
                        if size > MOST_FRAME_BYTES:
                            raise Unavailable(f"fragment stream from {self.url} declared a frame of {size} bytes, "
                                              f"past the {MOST_FRAME_BYTES} any frame may have: dropped it")  # fmt: skip
                        total = STREAM_RECORD.size + size
                        if len(buffer) < total:
                            break
                        frame = bytes(buffer[STREAM_RECORD.size : total])
                        del buffer[:total]
                        yield frame
        except httpx.TransportError as exc:
            raise Unavailable(f"fragment stream from {self.url} broke: {exc!r}") from None
        except GeneratorExit:
            self._drop()
            raise

    def _drop(self) -> None:
        """Drop this client's connections, which ends every stream on them (``fragments``)."""
        self.http.close()
        self.http = self._http()

    # -- plumbing -------------------------------------------------------------------------------
    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._request(method, path, **kwargs)
        try:
            body = response.json()
        except (ValueError, RecursionError):  # not JSON, not UTF-8 (a proxy's page), or nested past the stack
            raise Unavailable(f"{method} {path} on {self.url}: the answer is not JSON ({response.content[:60]!r})") from None
        if not isinstance(body, dict):
            raise Unavailable(f"{method} {path} on {self.url}: expected a JSON object, got {type(body).__name__}")
        return body

    def _request(self, method: str, path: str, most: int = MOST_ANSWER_BYTES, **kwargs: Any) -> httpx.Response:
        """The answer, read whole up to ``most`` bytes: past it the connection is dropped and the call is
        Unavailable (a 400 MiB heartbeat answer was buffered whole, twice over in the learner's memory)."""
        what = f"{method} {path} on {self.url}"
        try:
            with self.http.stream(method, f"{self.url}{path}", extensions=self.extensions, **kwargs) as streamed:
                self._stream = streamed.extensions.get("network_stream")
                content = bytearray()
                for chunk in streamed.iter_bytes():
                    content += chunk
                    if len(content) > most:
                        self.http.close()  # the rest may still be coming: no later call waits behind it
                        self.http = self._http()
                        raise Unavailable(f"{what}: the answer passed the {most} bytes any such answer may have")
        except httpx.TransportError as exc:
            raise Unavailable(f"{what}: {exc!r}") from None
        response = httpx.Response(streamed.status_code, headers={"content-type": streamed.headers.get("content-type", "")},
                                  content=bytes(content), request=streamed.request)  # fmt: skip
        _raise_for(response, response.content)
        return response


def _raise_for(response: httpx.Response, content: bytes) -> None:
    status = response.status_code
    if status < 400:
        return
    try:
        body = httpx.Response(status, content=content).json()
        if not isinstance(body, dict):
            raise ValueError("not an error object")
        code, reason = printable(str(body.get("error", "")), 200), printable(str(body.get("reason", "")))
    except ValueError:  # a peer's words go into the learner's log: cut, and no line of their own
        code, reason = "", printable(content[:200].decode("utf-8", "replace"))
    if status >= 500:
        raise Unavailable(f"syncer error {status} {code}: {reason}")
    raise Refused(status, code, reason)
