"""A local instance-metadata endpoint that serves spot interruption notices to Docker "VMs".

It answers like AWS's ``/latest/meta-data/spot/instance-action`` with IMDSv2
required (the default for new instances): a request without a session token
from ``PUT /latest/api/token`` gets 401, so a watcher that forgot the token
fails here as it would on EC2; with one, 404 until a notice is posted for the
calling instance, then 200 with the action and the time of the kill. The caller is identified by its source address, as a cloud's
metadata service does, so the learner agent's notice watcher is the same code
on a cloud VM and here. ``ddctl chaos preempt`` posts notices on the loopback
admin path; nothing else may. Runs as ``python -m ddctl.providers.docker.metadata --run RUN``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from ddctl.errors import DdctlError
from ddctl.providers.base import RUN_LABEL
from ddctl_agents.entrypoint import add_label_option
from ddctl_agents.waiting import wait_until

NOTICE_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_PATH = "/latest/api/token"
ADMIN_PATH = "/admin/notices"


class Notices:
    """Outstanding notices by instance id, and who is calling from which address."""

    def __init__(self, resolve: Callable[[str], str | None]) -> None:
        self._resolve = resolve
        self._by_instance: dict[str, float] = {}
        self._lock = threading.Lock()

    def post(self, instance: str, seconds: float) -> None:
        with self._lock:
            self._by_instance[instance] = time.time() + seconds

    def for_address(self, address: str) -> float | None:
        """The kill time announced to the instance at ``address``, if any."""
        instance = self._resolve(address)
        with self._lock:
            return None if instance is None else self._by_instance.get(instance)

    def outstanding(self) -> dict[str, float]:
        with self._lock:
            return dict(self._by_instance)


class Tokens:
    """IMDSv2 session tokens this endpoint issued (random, kept for the endpoint's life)."""

    def __init__(self) -> None:
        self._issued: set[str] = set()
        self._lock = threading.Lock()

    def issue(self) -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._issued.add(token)
        return token

    def valid(self, token: str) -> bool:
        with self._lock:
            return token in self._issued


def make_handler(notices: Notices, tokens: Tokens | None = None) -> type[BaseHTTPRequestHandler]:
    issued = tokens or Tokens()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict[str, Any] | None = None) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:  # noqa: N802
            if self.path != TOKEN_PATH or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "").isdigit():
                self._send(400, {"error": "PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds"})
                return
            data = issued.issue().encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            if self.path == NOTICE_PATH and not issued.valid(self.headers.get("X-aws-ec2-metadata-token", "")):
                self._send(401)  # IMDSv2 required: no (valid) session token, no answer
            elif self.path == NOTICE_PATH:
                kill_at = notices.for_address(self.client_address[0])
                if kill_at is None:
                    self._send(404)
                else:
                    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(kill_at))
                    self._send(200, {"action": "terminate", "time": when, "seconds_left": max(kill_at - time.time(), 0.0)})
            elif self.path == ADMIN_PATH and self.client_address[0] == "127.0.0.1":
                self._send(200, {"notices": notices.outstanding()})
            else:
                self._send(404)

        def do_POST(self) -> None:  # noqa: N802
            if self.path != ADMIN_PATH or self.client_address[0] != "127.0.0.1":
                self._send(403, {"error": "notices are posted from this machine's loopback only"})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                notices.post(str(body["instance"]), float(body["seconds"]))
            except (ValueError, KeyError, TypeError) as exc:
                self._send(400, {"error": f"expected {{instance, seconds}}: {exc}"})
                return
            self._send(200, {"ok": True})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return None  # one poll per second per learner would drown the log

    return Handler


def post_notice(port: int, instance: str, seconds: float) -> None:
    try:
        response = httpx.post(f"http://127.0.0.1:{port}{ADMIN_PATH}", json={"instance": instance, "seconds": seconds}, timeout=5)
    except httpx.HTTPError as exc:
        raise DdctlError(f"the metadata endpoint on port {port} is unreachable: {exc}") from None
    if response.status_code != 200:
        raise DdctlError(f"the metadata endpoint refused the notice: {response.status_code} {response.text}")


def outstanding(port: int) -> dict[str, float]:
    try:
        return dict(httpx.get(f"http://127.0.0.1:{port}{ADMIN_PATH}", timeout=5).json()["notices"])
    except (httpx.HTTPError, ValueError, KeyError):
        return {}


def seconds_left(port: int) -> dict[str, float]:
    """Instance id -> seconds until its announced kill (0 once it has passed)."""
    now = time.time()
    return {ident: max(at - now, 0.0) for ident, at in outstanding(port).items()}


def ensure_endpoint(run: str, port_file: Path, log: Path) -> int:
    """The run's endpoint, started (a labelled local process) unless it runs already; returns its port."""
    from ddctl.providers.base import InstanceSpec
    from ddctl.providers.process import ProcessProvider

    helpers = ProcessProvider()
    if not any(i.name == "metadata" for i in helpers.list_run(run)):
        port_file.unlink(missing_ok=True)
        argv = (sys.executable, "-m", "ddctl.providers.docker.metadata", "--run", run, "--port-file", str(port_file))
        helpers.create(InstanceSpec(run=run, name="metadata", region="", role="metadata", argv=argv, log=log))

    def port() -> str:
        return port_file.read_text().strip() if port_file.exists() else ""

    late = lambda message: DdctlError(f"{message}; see {log}")  # noqa: E731
    return int(wait_until(port, timeout_s=60, every_s=0.05, what="the metadata endpoint's port", error=late))


def stop_endpoint(run: str) -> list[str]:
    """Stop the run's endpoint if it runs; returns what was stopped."""
    from ddctl.providers.process import ProcessProvider

    helpers = ProcessProvider()
    stopped = [i for i in helpers.list_run(run) if i.name == "metadata"]
    for instance in stopped:
        helpers.terminate(instance, grace_s=5.0)
    return [i.name for i in stopped]


def main(argv: list[str] | None = None) -> int:
    from ddctl.providers.docker.engine import Engine

    parser = argparse.ArgumentParser(
        prog="python -m ddctl.providers.docker.metadata", description="Serve spot notices to a run's instances."
    )
    parser.add_argument("--run", required=True)
    parser.add_argument("--port-file", type=Path, required=True, help="write the bound port here once listening")
    add_label_option(parser)
    args = parser.parse_args(argv)
    engine = Engine()
    notices = Notices(lambda address: engine.container_at({RUN_LABEL: args.run}, address))
    server = ThreadingHTTPServer(("0.0.0.0", 0), make_handler(notices))
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(args.port_file)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
