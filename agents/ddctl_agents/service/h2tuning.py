"""Open hypercorn's HTTP/2 flow-control window so one upload can fill a fast link.

hypercorn advertises the protocol's default 64 KiB stream and connection
windows, so a client may have only 64 KiB in flight before it must wait for a
WINDOW_UPDATE: a 64 MiB upload over loopback then ran at 0.45x HTTP/1.1 here
(docs/benchmarks.md). hypercorn has no setting for it, so this patches its H2
protocol, once, to advertise ``WINDOW`` bytes for streams and the connection.
hypercorn acknowledges received data at once, so the window does not add
buffering on our side; memory stays bounded by the request size limit. It also
accepts DATA frames of up to ``FRAME`` bytes instead of 16 KiB: hypercorn
handles every frame in Python, so a 64 MiB upload in 4096 frames kept the
server busier than the transfer itself.

It also carries the fix of hypercorn PR #334 (open upstream): when we refuse an
upload early (413, 401) and close the stream, DATA frames still in flight for it
raised KeyError and killed the whole connection, and with it every other
stream on it. Such frames are now acknowledged (flow control) and dropped.

And a request whose ``:path`` is not ASCII (HTTP requires it percent-encoded)
made hypercorn's ``path.decode("ascii")`` raise inside the connection's task,
which killed the connection with an unhandled-exception trace in the log; such
a request is now answered 400 on its own stream.

Last, it keeps each open connection's socket by its addresses, so a handler can
read the kernel's TCP_INFO for the connection it answers on
(``connection_socket``): that is how the syncer measures a learner's downlink.
A connection whose TLS close crosses data still in flight (asyncio raises
APPLICATION_DATA_AFTER_CLOSE_NOTIFY as it unwraps) is over either way: one line
says so, not an unhandled-exception trace from the loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import ssl
from collections.abc import Mapping
from typing import Any

import h2.events
import h2.exceptions
import h2.settings
from hypercorn.asyncio import tcp_server
from hypercorn.protocol import h2 as hypercorn_h2
from hypercorn.utils import parse_socket_addr

WINDOW = int(os.environ.get("DDCTL_H2_WINDOW", 16 << 20))
"""Bytes a peer may send before waiting for us; DDCTL_H2_WINDOW=65535 restores hypercorn's default."""
FRAME = int(os.environ.get("DDCTL_H2_FRAME", 1 << 20))
"""Largest DATA frame we accept; DDCTL_H2_FRAME=16384 restores the protocol default."""
_DEFAULT_WINDOW = 65_535
log = logging.getLogger(__name__)
_SOCKETS: dict[tuple[Any, Any], Any] = {}
"""Each open connection's socket by its (client, server) addresses, as hypercorn writes them into the scope."""


def connection_socket(scope: Mapping[str, Any]) -> Any:
    """The socket a request came on (asyncio's transport socket: getsockopt works), or None if unknown."""
    client, server = scope.get("client"), scope.get("server")
    return None if client is None or server is None else _SOCKETS.get((tuple(client), tuple(server)))


def _keep_sockets() -> None:
    """Wrap hypercorn's asyncio ``TCPServer.run`` so that each connection's socket is known while it is open."""
    server: Any = tcp_server.TCPServer
    if hasattr(server, "_ddctl_original_run"):
        return
    original_run = server.run

    async def run(self: Any) -> None:
        sock = self.writer.get_extra_info("socket")
        try:
            key = (parse_socket_addr(sock.family, sock.getpeername()), parse_socket_addr(sock.family, sock.getsockname()))
        except (OSError, AttributeError):  # gone already, or not a socket: nothing to measure
            key = None
        if key is not None and None not in key:
            _SOCKETS[key] = sock
        try:
            await original_run(self)
        except ssl.SSLError as exc:  # the peer's TLS close crossed our data: the connection is over either way
            log.info("a connection closed uncleanly (%s): %s", key[0] if key else "?", exc.reason or exc)
        finally:
            if key is not None and _SOCKETS.get(key) is sock:
                del _SOCKETS[key]

    server._ddctl_original_run, server.run = original_run, run


def install(window: int = WINDOW, frame: int = FRAME) -> None:
    _keep_sockets()
    protocol: Any = hypercorn_h2.H2Protocol
    if getattr(protocol, "_ddctl_window", None) == (window, frame):
        return
    if not _DEFAULT_WINDOW <= window < 2**31:
        raise ValueError(f"HTTP/2 window must be in [{_DEFAULT_WINDOW}, 2**31), got {window}")
    if not 2**14 <= frame < 2**24:
        raise ValueError(f"HTTP/2 frame size must be in [2**14, 2**24), got {frame}")
    original_init = getattr(protocol, "_ddctl_original_init", protocol.__init__)
    original_initiate = getattr(protocol, "_ddctl_original_initiate", protocol.initiate)
    original_events = getattr(protocol, "_ddctl_original_events", protocol._handle_events)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        settings = self.connection.local_settings
        settings[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE] = window
        settings[h2.settings.SettingCodes.MAX_FRAME_SIZE] = frame
        settings.acknowledge()  # enforce our own values at once; the peer learns them from our preface
        self.connection.max_inbound_frame_size = frame
        self.connection.incoming_buffer.max_frame_size = frame

    async def initiate(self: Any, headers: Any = None, settings: Any = None) -> None:
        await original_initiate(self, headers, settings)
        if window > _DEFAULT_WINDOW:
            self.connection.increment_flow_control_window(window - _DEFAULT_WINDOW)
            await self._flush()

    async def _handle_events(self: Any, events: list[Any]) -> None:
        for event in events:  # one at a time: a stream may close while an earlier event is handled
            if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
                with contextlib.suppress(h2.exceptions.StreamClosedError):
                    self.connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                continue
            if isinstance(event, h2.events.RequestReceived) and not _ascii_path(event.headers):
                await _refuse(self, event.stream_id, "the request path must be ASCII (percent-encode anything else)")
                continue
            await original_events(self, [event])

    protocol._ddctl_original_init, protocol._ddctl_original_initiate = original_init, original_initiate
    protocol._ddctl_original_events = original_events
    protocol.__init__, protocol.initiate, protocol._handle_events = __init__, initiate, _handle_events
    protocol._ddctl_window = (window, frame)


def _ascii_path(headers: Any) -> bool:
    return all(bytes(value).isascii() for name, value in headers or () if bytes(name) == b":path")


async def _refuse(protocol: Any, stream_id: int, reason: str) -> None:
    body = json.dumps({"error": "bad_request", "reason": reason}).encode()
    headers = [(b":status", b"400"), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    with contextlib.suppress(h2.exceptions.ProtocolError):
        protocol.connection.send_headers(stream_id, headers)
        protocol.connection.send_data(stream_id, body, end_stream=True)
    await protocol._flush()
