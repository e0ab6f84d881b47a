"""How long a Compute Engine read retries a 503 storm: the library's default, and ddctl's bounded read policy.

``.venv/bin/python docs/measure_gcp_reads.py`` (about 45 s) against the tests' fake of the Compute API,
which answers every ``instances.get`` with 503. With only ``timeout=3`` the call is still retrying when
the script gives up on it at 35 s (``timeout`` bounds one attempt; the default retry's own deadline is
600 s); with ``Clients.read`` bounded to 6 s it ends in a ``RetryError``. Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from ddctl.providers.gcp import clients as gcp_clients  # noqa: E402
from gcp_cloud import GcpCloud  # noqa: E402 (the tests' fake, on the path set above)

GIVE_UP_S = 35.0


def attempt(cloud: GcpCloud, **kwargs: object) -> str:
    """Call ``instances.get`` under the storm on a thread; what happened, and how many attempts the fake saw."""
    cloud.reset()
    cloud.fail("instances.get", status=503, reason="backendError", times=None)
    outcome: list[str] = []
    started = time.monotonic()

    def call() -> None:
        try:
            cloud.client("InstancesClient").get(project=cloud.project, zone="us-central1-a", instance="x", **kwargs)
        except Exception as exc:  # noqa: BLE001 - what it ended with is the measurement
            outcome.append(f"{type(exc).__name__} after {time.monotonic() - started:.1f} s")

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(GIVE_UP_S)
    ended = outcome[0] if outcome else f"still retrying after {GIVE_UP_S:.0f} s"
    return f"{ended}, {len(cloud.calls('instances.get'))} attempts"


def main() -> None:
    with GcpCloud() as cloud:
        print(f"timeout=3 alone:            {attempt(cloud, timeout=3.0)}")
        gcp_clients.CALL_TIMEOUT_S = 6.0
        print(f"ddctl's read policy (6 s):  {attempt(cloud, **gcp_clients.Clients().read)}")


if __name__ == "__main__":
    main()
