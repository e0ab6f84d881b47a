"""Long-lived tasks of the service run under supervision: no exception ends a loop silently.

A loop that raises is reported (``on_failure`` logs it with its traceback and
counts it) and started again after a backoff that doubles from 0.1 s to 5 s and
resets once the loop has run a minute without failing. Cancellation passes
through: that is how the service stops its loops.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

RESTART_FIRST_S = 0.1
RESTART_MAX_S = 5.0
HEALTHY_AFTER_S = 60.0


async def supervise(
    name: str,
    loop: Callable[[], Awaitable[None]],
    on_failure: Callable[[str, BaseException], None],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run ``loop()`` until it returns, restarting it whenever it raises."""
    delay = RESTART_FIRST_S
    while True:
        started = clock()
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported and restarted: that is the point
            on_failure(name, exc)
        if clock() - started >= HEALTHY_AFTER_S:
            delay = RESTART_FIRST_S
        await asyncio.sleep(delay)
        delay = min(delay * 2, RESTART_MAX_S)
