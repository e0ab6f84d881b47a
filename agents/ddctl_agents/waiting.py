"""Waiting, in one place: poll until something holds, or retry a call until it succeeds.

Every "until a deadline" loop of the project goes through ``wait_until`` (or its
async twin for the SSH deploy), and every "try again later" through ``retry``
(capped exponential backoff with jitter), so a timeout always says what it was
waiting for and how long, and no loop spins without sleeping.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    every_s: float = 0.1,
    retry_on: tuple[type[Exception], ...] = (),
    error: Callable[[str], Exception] = TimeoutError,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """The first truthy value ``check()`` returns; ``error("timed out after ... waiting for WHAT")`` after ``timeout_s``.

    Exceptions in ``retry_on`` count as "not yet" (a poll across a network outlives one lost answer); the last one is
    named in the timeout and chained."""
    deadline = clock() + timeout_s
    last: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except retry_on as exc:
            last = exc
        if clock() >= deadline:
            raise error(f"timed out after {timeout_s:g}s waiting for {what}" + (f": {last}" if last else "")) from last
        sleep(min(every_s, max(deadline - clock(), 0.0)))


async def await_until(
    check: Callable[[], Awaitable[T | None]],
    *,
    timeout_s: float,
    what: str,
    every_s: float = 0.1,
    retry_on: tuple[type[Exception], ...] = (),
    error: Callable[[str], Exception] = TimeoutError,
) -> T:
    """``wait_until`` for a coroutine; exceptions in ``retry_on`` count as "not yet" (the last one is chained)."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while True:
        try:
            value = await check()
            if value:
                return value
        except retry_on as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise error(f"timed out after {timeout_s:g}s waiting for {what}" + (f": {last}" if last else "")) from last
        await asyncio.sleep(every_s)


def retry(
    call: Callable[[], T],
    *,
    retry_on: tuple[type[Exception], ...],
    stop: Callable[[], bool] = lambda: False,
    give_up_after_s: float = float("inf"),
    first_s: float = 0.1,
    max_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()`` until it raises nothing in ``retry_on``; backoff ``first_s`` doubling to ``max_s``, jittered.

    The error is re-raised when ``stop()`` says so or the next wait would pass ``give_up_after_s``."""
    delay, deadline = first_s, time.monotonic() + give_up_after_s
    while True:
        try:
            return call()
        except retry_on:
            if stop() or time.monotonic() + delay > deadline:
                raise
            sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, max_s)


def ready_file(start_file: Path, name: str) -> Path:
    """What process ``name`` makes beside a start file it waits for (a learner's ``--start-when``): whoever makes the
    start file can wait for every ready file first, and so start them all at once."""
    return start_file.with_name(f"{start_file.name}.{name}.ready")
