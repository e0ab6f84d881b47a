"""A bare HTTP/2 client over TLS (the h2 state machine on a socket) that sends exactly the bytes it is given.

httpx normalises what it sends (it percent-encodes paths and queries, computes
content-length, refuses odd header values); a hostile client does not. This
one sends any header bytes and body, reads the answer's status, and reports a
stream the server reset (or a connection it closed) as status 0.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions

Header = tuple[bytes, bytes]


class RawH2:
    def __init__(self, host: str, port: int, ca: Path | None, timeout_s: float = 30.0) -> None:
        self.host, self.port, self.ca, self.timeout_s = host, port, ca, timeout_s
        self.sock: socket.socket | ssl.SSLSocket | None = None
        self.conn: h2.connection.H2Connection | None = None
        self.reconnects = 0

    def _connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers and body go in two writes: no Nagle stall
        if self.ca is not None:
            context = ssl.create_default_context(cafile=str(self.ca))
            context.set_alpn_protocols(["h2"])
            self.sock = context.wrap_socket(raw, server_hostname=self.host)
        else:
            self.sock = raw
        config = h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False, normalize_outbound_headers=False
        )
        self.conn = h2.connection.H2Connection(config)
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock, self.conn = None, None

    def request(self, headers: list[Header], body: bytes = b"", until_headers: bool = False) -> tuple[int, bytes]:
        """Send one request as given; (status, body), or (0, b"") if the server reset it or hung up.

        ``until_headers`` returns at the response's headers and cancels the stream (a
        subscription never ends by itself)."""
        if self.conn is None:
            self._connect()
            self.reconnects += 1
        assert self.conn is not None and self.sock is not None
        try:
            stream = self.conn.get_next_available_stream_id()
            self.conn.send_headers(stream, headers, end_stream=not body)
            self.sock.sendall(self.conn.data_to_send())
            sent = 0
            status, answer = 0, bytearray()
            while True:
                while sent < len(body):
                    window = min(self.conn.local_flow_control_window(stream), self.conn.max_outbound_frame_size)
                    if window <= 0:
                        break
                    chunk = body[sent : sent + window]
                    sent += len(chunk)
                    self.conn.send_data(stream, chunk, end_stream=sent == len(body))
                self.sock.sendall(self.conn.data_to_send())
                data = self.sock.recv(65536)
                if not data:
                    self.close()
                    return 0, b""
                for event in self.conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                        status = int(dict(event.headers)[b":status"])
                        if until_headers:
                            self._cancel(stream)
                            return status, b""
                    elif isinstance(event, h2.events.DataReceived):  # every stream's, or the connection window shrinks
                        with contextlib.suppress(h2.exceptions.StreamClosedError):
                            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                        if event.stream_id == stream:
                            answer += event.data
                    elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                        self.sock.sendall(self.conn.data_to_send())
                        return status, bytes(answer)
                    elif isinstance(event, h2.events.StreamReset) and event.stream_id == stream:
                        return status, bytes(answer)
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        self.close()
                        return status, bytes(answer)
                self.sock.sendall(self.conn.data_to_send())
        except (OSError, h2.exceptions.ProtocolError):
            self.close()
            return 0, b""

    def _cancel(self, stream: int) -> None:
        assert self.conn is not None and self.sock is not None
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self.conn.reset_stream(stream)
        self.sock.sendall(self.conn.data_to_send())


def request_headers(method: str, path: bytes, token: str, extra: list[Header] | None = None) -> list[Header]:
    return [
        (b":method", method.encode()),
        (b":scheme", b"https"),
        (b":authority", b"127.0.0.1"),
        (b":path", path),
        (b"authorization", f"Bearer {token}".encode()),
        *(extra or []),
    ]
