"""boto3 clients for one profile, made lazily and cached per (service, region, retry policy).

Credentials come from boto3's standard chain (environment, ``AWS_PROFILE`` or
``--profile``, the shared files, SSO, instance roles); endpoints from botocore's
own ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_EC2`` variables, which is how tests
point every process of a run (the controller too) at a local moto server.

Two retry policies. Most calls use botocore's standard mode (throttling and
5xx are retried with backoff). ``RunInstances`` must not be: EC2 answers a
capacity shortage with HTTP 500, which standard mode retries silently (three
attempts; ``max_attempts=1`` still makes two), so creating fails fast
(``total_max_attempts=1``) and failover decides where to try next.
"""

from __future__ import annotations

import os
import threading
from typing import Any

PROFILE_ENV = "AWS_PROFILE"
STANDARD = {"mode": "standard", "total_max_attempts": 3}
FAIL_FAST = {"mode": "standard", "total_max_attempts": 1}


class Clients:
    """A boto3 session of one profile and its clients; thread-safe (boto3 sessions are not)."""

    def __init__(self, profile: str | None = None) -> None:
        self.profile = profile
        """An explicit profile (its credentials win); without one, boto3's chain reads ``AWS_PROFILE`` itself."""
        self._session: Any = None
        self._clients: dict[tuple[str, str, bool], Any] = {}
        self._lock = threading.Lock()

    @property
    def described(self) -> str:
        """How the credentials were chosen, for error messages."""
        profile = self.profile or os.environ.get(PROFILE_ENV)
        return f"profile {profile!r}" if profile else "the default credential chain (no profile set)"

    def client(self, service: str, region: str, *, fail_fast: bool = False) -> Any:
        """The cached client of ``service`` in ``region``; ``fail_fast``: one attempt, no retries."""
        key = (service, region, fail_fast)
        with self._lock:
            if key not in self._clients:
                import boto3  # lazily: ``ddctl --help`` never loads boto3
                from botocore.config import Config

                if self._session is None:
                    self._session = boto3.session.Session(profile_name=self.profile)
                config = Config(retries=FAIL_FAST if fail_fast else STANDARD, connect_timeout=10, read_timeout=30)
                self._clients[key] = self._session.client(service, region_name=region, config=config)
            return self._clients[key]
