"""google-cloud-compute clients (REST transport), made lazily, and our own wait on operations.

Credentials are Application Default Credentials; the project is the region's
``project:`` in the file, else ``GOOGLE_CLOUD_PROJECT``, else the one ADC names.
``DDCTL_GCP_ENDPOINT`` (e.g. ``http://127.0.0.1:PORT``) points every client at
another Compute API with anonymous credentials: that is how tests and emulators
stand in for Google, as ``AWS_ENDPOINT_URL`` does for AWS.

Two pitfalls of the library shape this module. ``insert()`` returns an
extended operation whose ``.result()`` polls through a second client the
library builds itself, *without our client options*, so against any endpoint
but Google's it phones Google: we call the ``*_unary`` methods and wait with
our own ``ZoneOperationsClient.wait`` loop. And ``get``/``list`` retry 503s for
up to 600 s unless given a timeout: every read here passes ``CALL_TIMEOUT_S``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ddctl.errors import DdctlError

ENDPOINT_ENV = "DDCTL_GCP_ENDPOINT"
PROJECT_ENV = "GOOGLE_CLOUD_PROJECT"
CALL_TIMEOUT_S = 30.0
"""Every call's deadline. A read's ``timeout=`` alone does not bound it: measured with google-api-core 2.44, ``get``
under a 503 storm with ``timeout=3`` was still retrying after 35 s (the default retry's own 600 s deadline governs;
``timeout`` only bounds each attempt). So reads also get a retry policy of their own (``read``)."""
OPERATION_TIMEOUT_S = 600.0


class OperationFailed(Exception):
    """An operation that finished with errors (capacity, quota, ...): ``errors.classify`` reads its codes."""

    def __init__(self, operation: Any) -> None:
        first = operation.error.errors[0] if operation.error.errors else None
        super().__init__(f"{first.code}: {first.message}" if first is not None else f"operation {operation.name} failed")
        self.operation = operation


class Clients:
    """Compute clients sharing one set of credentials and options; thread-safe."""

    def __init__(self) -> None:
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return os.environ.get(ENDPOINT_ENV, "")

    @property
    def described(self) -> str:
        """How the credentials were chosen, for error messages."""
        if self.endpoint:
            return f"anonymous, against {ENDPOINT_ENV}={self.endpoint}"
        return "Application Default Credentials (gcloud auth application-default login, or GOOGLE_APPLICATION_CREDENTIALS)"

    def client(self, name: str) -> Any:
        """The cached ``compute_v1.<name>`` (e.g. ``InstancesClient``)."""
        with self._lock:
            if name not in self._clients:
                from google.cloud import compute_v1  # lazily: ``ddctl --help`` never loads the SDK

                kwargs: dict[str, Any] = {"transport": "rest"}
                if self.endpoint:
                    from google.api_core.client_options import ClientOptions
                    from google.auth.credentials import AnonymousCredentials

                    kwargs |= {"client_options": ClientOptions(api_endpoint=self.endpoint), "credentials": AnonymousCredentials()}  # type: ignore[no-untyped-call]
                self._clients[name] = getattr(compute_v1, name)(**kwargs)
            return self._clients[name]

    @property
    def read(self) -> dict[str, Any]:
        """The keyword arguments of every read (get, list): transient errors retried, backed off, for CALL_TIMEOUT_S at most.

        Writes keep the library's default (no retry: a retried insert could make a second VM)."""
        from google.api_core import exceptions, retry

        transient = retry.if_exception_type(
            exceptions.ServiceUnavailable, exceptions.InternalServerError, exceptions.TooManyRequests, exceptions.BadGateway,
            exceptions.GatewayTimeout,
        )  # fmt: skip
        policy = retry.Retry(initial=0.5, maximum=5.0, multiplier=2.0, timeout=CALL_TIMEOUT_S, predicate=transient)
        return {"retry": policy, "timeout": CALL_TIMEOUT_S}

    def project(self, chosen: str = "") -> str:
        """The project to act in: the file's, ``GOOGLE_CLOUD_PROJECT``, or the one ADC names."""
        if chosen or os.environ.get(PROJECT_ENV):
            return chosen or os.environ[PROJECT_ENV]
        if not self.endpoint:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError

            try:
                _, project = google.auth.default()
            except DefaultCredentialsError:
                project = None
            if project:
                return str(project)
        raise DdctlError(f"no GCP project: set `project:` on the region or {PROJECT_ENV}")

    # -- operations ---------------------------------------------------------------------------
    def wait(
        self, operation: Any, project: str, *, zone: str = "", region: str = "", timeout_s: float = OPERATION_TIMEOUT_S
    ) -> Any:
        """Wait for a zonal, regional or global operation with our own clients; raise OperationFailed on errors."""
        from google.cloud import compute_v1

        done = compute_v1.Operation.Status.DONE
        if zone:
            waiter, where = self.client("ZoneOperationsClient"), {"zone": zone}
        elif region:
            waiter, where = self.client("RegionOperationsClient"), {"region": region}
        else:
            waiter, where = self.client("GlobalOperationsClient"), {}
        deadline = time.monotonic() + timeout_s
        while operation.status != done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"operation {operation.name} not done after {timeout_s:g} s")
            operation = waiter.wait(project=project, operation=operation.name, timeout=CALL_TIMEOUT_S, **where)
        if operation.error.errors:
            raise OperationFailed(operation)
        return operation
