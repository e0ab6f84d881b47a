"""Supervised loops: a failure is reported and the loop restarted, with backoff; cancellation passes through."""

from __future__ import annotations

import asyncio

import pytest

from ddctl_agents.service import supervise as supervision


def test_a_failing_loop_is_reported_and_restarted_until_it_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision, "RESTART_FIRST_S", 0.001)
    runs: list[int] = []
    failures: list[tuple[str, str]] = []

    async def loop() -> None:
        runs.append(len(runs))
        if len(runs) < 4:
            raise RuntimeError(f"boom {len(runs)}")

    asyncio.run(supervision.supervise("rounds", loop, lambda name, exc: failures.append((name, str(exc)))))
    assert len(runs) == 4 and failures == [("rounds", "boom 1"), ("rounds", "boom 2"), ("rounds", "boom 3")]


def test_backoff_doubles_to_its_cap_and_resets_after_a_healthy_run(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    now = [0.0]

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    monkeypatch.setattr(supervision.asyncio, "sleep", fake_sleep)
    attempts = iter([1.0] * 8 + [120.0] + [1.0])  # how long each attempt runs before it fails

    async def loop() -> None:
        try:
            now[0] += next(attempts)
        except StopIteration:
            return
        raise ValueError("again")

    asyncio.run(supervision.supervise("x", loop, lambda *_: None, clock=lambda: now[0]))
    assert sleeps[:8] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert sleeps[8] == 0.1  # a minute of health resets the backoff


def test_cancellation_is_not_a_failure() -> None:
    failures: list[str] = []

    async def forever() -> None:
        await asyncio.sleep(3600)

    async def main() -> None:
        task = asyncio.create_task(supervision.supervise("x", forever, lambda name, exc: failures.append(name)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert failures == []
