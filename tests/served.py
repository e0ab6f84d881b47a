"""A fake cloud endpoint's plumbing: an HTTP server on 127.0.0.1:<free port>, on a thread of its own.

The GCE fake (``gcp_cloud.py``) and the Cloud Storage fake (``gcs_fake.py``) serve their APIs this way;
a request handler finds the fake it answers for as ``self.server.owner``.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class Served:
    """Start, stop and address of a fake; subclasses name their request handler (``handler``)."""

    thread_name = "fake"
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> Self:
        if self._server is None:
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
            self._server.daemon_threads = True
            self._server.owner = self  # type: ignore[attr-defined]
            self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join()
            self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
