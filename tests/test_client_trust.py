"""What a learner's or relay's client takes from the other end is checked: an answer that is not ours (a proxy's
page, a list where an object belongs, a stream record declaring more than any frame) is a clean Unavailable or
Refused that the loops retry, never a ValueError or AttributeError that ends a thread, nor a buffer without end."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ddctl_agents.agent.client import MOST_ANSWER_BYTES, MOST_FRAME_BYTES, STREAM_RECORD, SyncerClient
from ddctl_agents.errors import Refused, Unavailable

ANSWERS: dict[str, tuple[int, str, bytes]] = {
    "/v1/status": (200, "text/html", b"<html>502 Bad Gateway</html>"),
    "/v1/shards": (200, "application/json", b"[1, 2, 3]"),
    "/v1/relay": (200, "application/json", b"\xff\xfe not utf-8"),
    "/v1/admin/stop": (409, "application/json", b'["a", "list"]'),
    "/v1/heartbeat": (403, "application/json", b'{"error": "x", "reason": "' + b"r" * 5000 + b'"}'),
    "/v1/leave": (403, "application/json", b'{"error": "no\\n", "reason": "x\\n2026-01-01 INFO forged \\u001b[2J"}'),
    "/v1/admin/readmit": (502, "text/html", b"<html>\r\nBad Gateway\x1b[31m</html>"),
    "/v1/register": (200, "application/json", b" " * MOST_ANSWER_BYTES + b"{}"),
    "/v1/job": (200, "application/json", b"[" * 100_000 + b"]" * 100_000),
    "/v1/fragments": (200, "application/octet-stream", STREAM_RECORD.pack(1 << 40) + b"\0" * 4096),
}


class Hostile(BaseHTTPRequestHandler):
    """Answers every path with what ``ANSWERS`` says, whatever was asked."""

    def _answer(self) -> None:
        status, kind, body = ANSWERS[self.path.split("?")[0]]
        # read the request first: a socket closed with unread bytes resets the connection, and the reset can reach the
        # client before the answer's last bytes (once in CI: "Connection reset by peer" in place of the size refusal)
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def client() -> Iterator[SyncerClient]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    made = SyncerClient(f"http://127.0.0.1:{server.server_address[1]}", "token", http2=False, timeout_s=10)
    yield made
    made.close()
    server.shutdown()
    server.server_close()


def test_an_answer_that_is_not_a_json_object_is_unavailable(client: SyncerClient) -> None:
    with pytest.raises(Unavailable, match=r"GET /v1/status on http://127\.0\.0\.1:\d+: the answer is not JSON"):
        client.status()
    with pytest.raises(Unavailable, match="expected a JSON object, got list"):
        client.shards()
    with pytest.raises(Unavailable, match="the answer is not JSON"):
        client.relay_address()  # bytes that are not UTF-8
    with pytest.raises(Unavailable, match="the answer is not JSON"):
        client.job()  # nested past the stack: a RecursionError out of the learner's start


def test_an_error_body_of_the_wrong_shape_or_size_is_still_a_refusal(client: SyncerClient) -> None:
    with pytest.raises(Refused) as refused:
        client.stop_job("why")
    assert refused.value.status == 409 and '["a", "list"]' in str(refused.value)
    with pytest.raises(Refused) as long:
        client.heartbeat({})
    assert long.value.status == 403 and len(str(long.value)) < 800  # a peer's reason is cut before it is logged


def test_a_stream_record_past_any_frame_is_refused_before_it_is_buffered(client: SyncerClient) -> None:
    with pytest.raises(Unavailable, match=f"declared a frame of {1 << 40} bytes, past the {MOST_FRAME_BYTES}"):
        next(client.fragments([0]))


def test_the_clients_frame_bound_is_the_wire_formats() -> None:
    from ddctl_agents.core import wire

    limits = wire.DEFAULT_LIMITS
    assert wire._PREFIX.size + limits.max_header + limits.max_payload + wire._CRC.size == MOST_FRAME_BYTES


def test_a_peers_reason_keeps_to_one_line_of_the_learners_log(client: SyncerClient) -> None:
    """A reason with a newline or an escape sequence read as a forged log line or cleared the operator's terminal."""
    with pytest.raises(Refused) as refused:
        client.leave("L0", "done")
    assert refused.value.code == "no\\n" and "x\\n2026-01-01 INFO forged \\x1b[2J" in str(refused.value)
    with pytest.raises(Unavailable) as unavailable:
        client.readmit("L1")
    assert "<html>\\r\\nBad Gateway\\x1b[31m</html>" in str(unavailable.value)
    assert not any(c in str(refused.value) + str(unavailable.value) for c in "\n\r\x1b")


def test_an_answer_past_any_answers_size_is_unavailable_and_the_client_goes_on(client: SyncerClient) -> None:
    """A heartbeat answer of 400 MiB was buffered whole (804 MB more in the learner); past 32 MiB it is dropped."""
    with pytest.raises(Unavailable, match=rf"POST /v1/register on .*: the answer passed the {MOST_ANSWER_BYTES} bytes"):
        client.register("L0", 1, "east")
    with pytest.raises(Unavailable, match="the answer is not JSON"):
        client.status()  # the same client answers its next call
