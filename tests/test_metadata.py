"""The local instance-metadata endpoint and the agent's notice watcher, over real HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import httpx
import pytest

from ddctl.errors import DdctlError
from ddctl.providers.docker.metadata import ADMIN_PATH, NOTICE_PATH, TOKEN_PATH, Notices, make_handler, outstanding, post_notice
from ddctl_agents.agent.notice import NoticeClient, Stop, is_notice, watch
from ddctl_agents.waiting import wait_until


@pytest.fixture
def endpoint() -> Iterator[tuple[int, dict[str, str]]]:
    """A metadata server whose callers are identified by a table of address -> instance id."""
    callers: dict[str, str] = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(Notices(callers.get)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], callers
    server.shutdown()
    server.server_close()


def imds_token(port: int) -> dict[str, str]:
    got = httpx.put(f"http://127.0.0.1:{port}{TOKEN_PATH}", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    assert got.status_code == 200 and got.text
    return {"X-aws-ec2-metadata-token": got.text}


def test_a_notice_is_served_only_to_the_instance_it_was_posted_for(endpoint: tuple[int, dict[str, str]]) -> None:
    port, callers = endpoint
    url = f"http://127.0.0.1:{port}{NOTICE_PATH}"
    callers["127.0.0.1"] = "vm-a"
    token = imds_token(port)
    assert httpx.get(url, headers=token).status_code == 404  # AWS's answer while there is no notice
    post_notice(port, "vm-b", 30)
    assert httpx.get(url, headers=token).status_code == 404  # someone else's notice
    post_notice(port, "vm-a", 30)
    answer = httpx.get(url, headers=token)
    assert answer.status_code == 200 and answer.json()["action"] == "terminate"
    assert 25 < answer.json()["seconds_left"] <= 30
    assert set(outstanding(port)) == {"vm-a", "vm-b"}


def test_bad_notices_are_refused_with_the_reason(endpoint: tuple[int, dict[str, str]]) -> None:
    port, _ = endpoint
    bad = httpx.post(f"http://127.0.0.1:{port}{ADMIN_PATH}", json={"instance": "vm-a"})
    assert bad.status_code == 400 and "expected {instance, seconds}" in bad.json()["error"]
    with pytest.raises(DdctlError, match="unreachable"):
        post_notice(1, "vm-a", 5)  # nothing listens on port 1


def test_the_watcher_stops_training_with_the_reason_when_the_notice_arrives(endpoint: tuple[int, dict[str, str]]) -> None:
    port, callers = endpoint
    callers["127.0.0.1"] = "vm-a"
    stop = Stop()
    watch(f"http://127.0.0.1:{port}{NOTICE_PATH}", stop, every_s=0.05)
    assert not stop.wait(0.3)  # 404s are not notices
    post_notice(port, "vm-a", 10)
    assert stop.wait(5) and stop.reason == "preemption_notice"


def test_notice_answers_of_each_cloud() -> None:
    assert is_notice(200, '{"action": "terminate", "time": "2026-11-29T18:42:23Z"}')  # AWS
    assert is_notice(200, "TRUE") and not is_notice(200, "FALSE\n")  # GCP's instance/preempted
    assert not is_notice(404, "") and not is_notice(500, "oops")
    stop = Stop()
    stop.trigger("sigterm")
    stop.trigger("preemption_notice")
    assert stop.reason == "sigterm"  # the first reason wins


def test_imdsv2_is_enforced_as_on_ec2_and_a_token_is_renewed_after_a_401(endpoint: tuple[int, dict[str, str]]) -> None:
    port, callers = endpoint
    callers["127.0.0.1"] = "vm-a"
    url = f"http://127.0.0.1:{port}{NOTICE_PATH}"
    post_notice(port, "vm-a", 30)
    assert httpx.get(url).status_code == 401  # no token: a plain GET never sees the notice
    assert httpx.get(url, headers={"X-aws-ec2-metadata-token": "forged"}).status_code == 401
    assert httpx.put(f"http://127.0.0.1:{port}{TOKEN_PATH}").status_code == 400  # the TTL header is required
    with httpx.Client(timeout=2) as http:
        client = NoticeClient(url, http)
        assert client.poll().status_code == 200
        client.token = "expired-or-from-a-restarted-endpoint"
        assert client.poll().status_code == 200 and client.token != "expired-or-from-a-restarted-endpoint"


@pytest.fixture
def gcp() -> Iterator[tuple[int, list[str]]]:
    """GCE's metadata server for ``instance/preempted`` and ``maintenance-event``: FALSE and NONE until told, only with
    Metadata-Flavor."""
    from http.server import BaseHTTPRequestHandler

    answer = ["FALSE", "NONE"]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            paths = {"/computeMetadata/v1/instance/preempted": 0, "/computeMetadata/v1/instance/maintenance-event": 1}
            ok = self.path in paths and self.headers.get("Metadata-Flavor") == "Google"
            body = answer[paths[self.path]].encode() if ok else b"Missing Metadata-Flavor:Google header"
            self.send_response(200 if ok else 403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], answer
    server.shutdown()
    server.server_close()


def test_the_watcher_reads_gcps_preempted_flag(gcp: tuple[int, list[str]]) -> None:
    port, answer = gcp
    stop = Stop()
    watch(f"http://127.0.0.1:{port}/computeMetadata/v1/instance/preempted", stop, every_s=0.05)
    assert not stop.wait(0.3)  # FALSE is not a notice
    answer[0] = "TRUE"
    assert stop.wait(5) and stop.reason == "preemption_notice"


def test_a_maintenance_event_that_ends_the_vm_is_a_notice_a_migration_is_not(gcp: tuple[int, list[str]]) -> None:
    port, answer = gcp
    stop = Stop()
    watch(f"http://127.0.0.1:{port}/computeMetadata/v1/instance/preempted", stop, every_s=0.05)
    answer[1] = "MIGRATE_ON_HOST_MAINTENANCE"
    assert not stop.wait(0.3)  # a live migration: training goes on
    answer[1] = "TERMINATE_ON_HOST_MAINTENANCE"
    assert stop.wait(5) and stop.reason == "preemption_notice"


def test_a_rebalance_recommendation_is_noted_and_training_goes_on() -> None:
    """AWS's elevated-risk signal: the watcher notes it once (with its IMDSv2 token); it is not a notice."""
    from http.server import BaseHTTPRequestHandler

    posted, asked = [False], []

    class Imds(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:  # noqa: N802 (the stdlib's name)
            self._send(200, "token-1")

        def do_GET(self) -> None:  # noqa: N802
            asked.append(self.path)
            if self.headers.get("X-aws-ec2-metadata-token") != "token-1":
                self._send(401, "")
            elif self.path.endswith("/rebalance") and posted[0]:
                self._send(200, '{"noticeTime": "2026-11-30T22:00:00Z"}')
            else:
                self._send(404, "")

        def _send(self, status: int, body: str) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Imds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        stop = Stop()
        watch(f"http://127.0.0.1:{server.server_address[1]}{NOTICE_PATH}", stop, every_s=0.05)
        assert not stop.wait(0.3) and not stop.rebalance_recommended
        posted[0] = True
        wait_until(lambda: stop.rebalance_recommended, timeout_s=5, what="the recommendation to be noted")
        assert not stop.wait(0.3)  # training goes on
        assert any(path.endswith("/events/recommendations/rebalance") for path in asked)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("odd", ["token-é", "tok en", "x" * 2000, ""])
def test_an_odd_token_answer_does_not_blind_the_watcher(odd: str, caplog: pytest.LogCaptureFixture) -> None:
    """A token that is not printable ASCII ended the watcher's thread (httpx's header encoding), one with a space or
    newline was kept six hours and made every poll fail: the notice was never seen (a hostile-input audit). The
    notice's body is logged with its control characters escaped."""
    from http.server import BaseHTTPRequestHandler

    tokens = [odd, odd, "token-2"]

    class Imds(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:  # noqa: N802 (the stdlib's name)
            self._send(200, tokens.pop(0) if len(tokens) > 1 else tokens[0])

        def do_GET(self) -> None:  # noqa: N802
            good = self.headers.get("X-aws-ec2-metadata-token") == "token-2"
            self._send(200, "terminate\n2026-05-01T00:00:00Z INFO forged\x1b[2J") if good else self._send(404, "")

        def _send(self, status: int, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Imds)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        stop = Stop()
        watch(f"http://127.0.0.1:{server.server_address[1]}{NOTICE_PATH}", stop, every_s=0.05)
        assert stop.wait(10) and stop.reason == "preemption_notice"
    finally:
        server.shutdown()
        server.server_close()
    assert any("the metadata service's token is not one" in m for m in caplog.messages)
    said = [m for m in caplog.messages if m.startswith("spot interruption notice")]
    assert said == ["spot interruption notice: terminate\\n2026-05-01T00:00:00Z INFO forged\\x1b[2J"]
