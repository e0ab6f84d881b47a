"""The fragment publisher coalesces versions for slow subscribers; the client retries what is worth retrying."""

from __future__ import annotations

import asyncio

import pytest

from ddctl_agents.agent.client import Unavailable, retry
from ddctl_agents.service.publisher import Published, Publisher
from ddctl_agents.waiting import wait_until


def test_a_slow_subscriber_gets_the_newest_version_only() -> None:
    async def scenario() -> list[tuple[int, int] | None]:
        pub = Publisher(2)
        for v in range(5):
            await pub.publish(Published(fragment=0, version=v, frame=b"x"))
        await pub.publish(Published(fragment=1, version=0, frame=b"y"))
        await pub.publish(Published(fragment=0, version=3, frame=b"old"))  # never goes backwards
        seen: list[tuple[int, int] | None] = []
        follow = pub.follow([-1, -1], keepalive_s=0.05)
        for _ in range(3):
            item = await follow.__anext__()
            seen.append(None if item is None else (item.fragment, item.version))
        await follow.aclose()
        return seen

    assert asyncio.run(scenario()) == [(0, 4), (1, 0), None]  # then a keep-alive on silence


def test_a_subscriber_behind_is_sent_the_oldest_version_first() -> None:
    async def scenario() -> list[tuple[int, int]]:
        pub = Publisher(3)
        for fragment, version in ((2, 0), (0, 0), (1, 0), (2, 1), (0, 1)):
            await pub.publish(Published(fragment=fragment, version=version, frame=b"x"))
        follow = pub.follow([-1, -1, -1], keepalive_s=0.05)
        seen = []
        for _ in range(3):
            item = await follow.__anext__()
            assert item is not None
            seen.append((item.fragment, item.version))
        await follow.aclose()
        return seen

    assert asyncio.run(scenario()) == [(1, 0), (2, 1), (0, 1)]  # by when each newest version was made


def test_a_subscriber_wakes_for_a_new_version() -> None:
    async def scenario() -> int:
        pub = Publisher(1)
        follow = pub.follow([0], keepalive_s=5.0)
        waiting = asyncio.ensure_future(follow.__anext__())
        await asyncio.sleep(0.01)
        await pub.publish(Published(fragment=0, version=1, frame=b"z"))
        item = await asyncio.wait_for(waiting, 1.0)
        await follow.aclose()
        assert item is not None
        return item.version

    assert asyncio.run(scenario()) == 1


def test_retry_backs_off_through_outages_and_gives_up_on_request() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Unavailable("down")
        return "up"

    assert retry(flaky) == "up" and len(calls) == 3
    with pytest.raises(Unavailable):
        retry(lambda: (_ for _ in ()).throw(Unavailable("always down")), give_up_after_s=0.3)
    with pytest.raises(Unavailable):
        retry(lambda: (_ for _ in ()).throw(Unavailable("stopping")), stop=lambda: True)


def test_wait_until_counts_a_retried_error_as_not_yet_and_names_the_last_at_its_timeout() -> None:
    answers = iter([Unavailable("no route"), None, {"phase": "finished"}])

    def poll() -> dict[str, str] | None:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_until(poll, timeout_s=5, what="the end", every_s=0.0, retry_on=(Unavailable,)) == {"phase": "finished"}
    with pytest.raises(TimeoutError, match=r"waiting for the end: still no route") as raised:
        wait_until(lambda: (_ for _ in ()).throw(Unavailable("still no route")), timeout_s=0.05, what="the end",
                   every_s=0.01, retry_on=(Unavailable,))  # fmt: skip
    assert isinstance(raised.value.__cause__, Unavailable)
    with pytest.raises(KeyError):  # anything not named is raised at once
        wait_until(lambda: {}["x"], timeout_s=5, what="the end", retry_on=(Unavailable,))
