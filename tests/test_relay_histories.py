"""How a relay's learners learn that a shard started over (``service/history.py``), and why a relay that has not heard
it yet is not believed.

A relay forgets what it held when a shard's stream names another history, ends its learners' streams and lists each
shard's history as they open again. A learner knows each shard's history first-hand from its registration; a relay's
list is believed once it agrees with that. Real processes for the end-to-end case (a synchronizer brought back on a
fresh state directory behind a relay), fakes for the pieces.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
from pathlib import Path

import pytest

from ddctl_agents.agent import again
from ddctl_agents.agent.subscription import RelayLink, Subscriber
from ddctl_agents.relay.feed import Feed
from ddctl_agents.service import history
from ddctl_agents.service.publisher import Published, Publisher
from ddctl_agents.waiting import wait_until
from tests.relay_harness import Counter, FakeShard, finished, relayed, start_learner, status_of, version_frame

OLD, NEW = "0123456789abcdef", "00000000000000aa"


def test_a_feed_whose_shard_started_over_forgets_what_it_held_and_asks_again_from_none() -> None:
    """A shard brought back without its state numbers its versions from 0 again: held, the old history's higher numbers
    would hide every version of the new one from the region's learners."""

    def reborn(shard: FakeShard) -> None:
        if len(shard.asked) == 1:  # the second stream reaches the shard's next life, which held nothing over
            shard.frames, shard.history, shard.breaks = [version_frame(0, 1)], "00000000000000aa", False

    shard = FakeShard([version_frame(0, 5), version_frame(1, 6)], breaks=True, history="0123456789abcdef", on_open=reborn)

    async def run() -> tuple[list[int], Feed]:
        publisher = Publisher(2)
        feed = Feed(["https://s0"], lambda url: shard, publisher, 2, stale_after_s=60)  # type: ignore[arg-type,return-value]
        feed.start(asyncio.get_running_loop())
        await asyncio.to_thread(wait_until, lambda: len(shard.asked) >= 3 and publisher.versions()[0] == 1, timeout_s=10,
                                what="the feed")  # fmt: skip
        feed.stop()
        return publisher.versions(), feed

    versions, feed = asyncio.run(run())
    assert shard.asked[:3] == [[-1, -1], [5, 6], [-1, -1]]  # the stream that named the new history is asked again
    assert versions == [1, -1] and feed.forgotten == 1 and feed.histories == {"https://s0": "00000000000000aa"}
    assert history.listing(feed.histories) == "https://s0=00000000000000aa"  # what its learners' streams list now


def test_a_publisher_that_forgets_ends_every_stream_following_it() -> None:
    """A relay's learner reading on would never see the new history's versions (numbered below what it holds), nor
    learn that it started over: its stream ends, and opens again naming the new history."""

    async def run() -> list[int | None]:
        publisher, got = Publisher(1), []
        await publisher.publish(Published(fragment=0, version=4, frame=b"x"))

        async def follow() -> None:
            async for item in publisher.follow([-1], keepalive_s=30.0):
                got.append(None if item is None else item.version)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.05)
        await publisher.forget()
        await asyncio.wait_for(task, timeout=5.0)  # ended, not waiting for the next version or keep-alive
        return got

    assert asyncio.run(run()) == [4]


def test_a_relayed_learner_names_each_shards_history_as_its_relay_lists_them() -> None:
    """Behind a relay a learner reads no shard's stream: the relay lists their histories, and the learner's updates and
    heartbeats name them (a shard that started over refuses them). A shard listed for the first time later is no
    change; one listed anew is: that shard started over."""
    lists = iter(["https://s0=0123456789abcdef,https://other=fedcba9876543210",  # not this learner's shard: left out
                  "https://s0=0123456789abcdef,https://s1=fedcba9876543210",  # s1 known now: nothing started over
                  "https://s0=00000000000000aa,https://s1=fedcba9876543210"])  # fmt: skip
    holds = [threading.Event() for _ in range(3)]

    def relist(relay: FakeShard) -> None:  # each stream ends (the test sets its hold) and the next lists anew
        relay.listed, relay.hold, relay.frames = next(lists), holds[len(relay.asked)], [version_frame(0, 1)]

    stopping, named = threading.Event(), threading.Semaphore(0)
    relay = FakeShard([], breaks=True, on_open=relist)
    link = RelayLink("https://r", lambda url: relay)  # type: ignore[arg-type,return-value]
    subscriber = Subscriber(lambda url: FakeShard([], hold=stopping), 1, stopping, lambda url: None, Counter(), relay=link)  # type: ignore[arg-type,return-value]
    subscriber.versions = [-1]
    listed = subscriber._listed
    subscriber._listed = lambda *args: (listed(*args), named.release())  # type: ignore[method-assign]
    threads = [threading.Thread(target=target, daemon=True) for _, target in subscriber.loops(["https://s0", "https://s1"])]
    for thread in threads:
        thread.start()
    try:
        assert named.acquire(timeout=10)
        assert subscriber.histories == {"https://s0": "0123456789abcdef"}  # not another learner's shard
        holds[0].set()  # the relay ends its stream; opened again, it lists s1 too
        assert named.acquire(timeout=10)
        assert subscriber.histories == {"https://s0": "0123456789abcdef", "https://s1": "fedcba9876543210"}
        assert not subscriber.started_over.is_set()
        holds[1].set()  # ended again as s0 started over; opened again, it lists s0's new history
        assert subscriber.started_over.wait(timeout=10)
    finally:
        stopping.set()
        for hold in holds:
            hold.set()
    assert "the synchronizer at https://s0 (as the relay at https://r lists it) started over" in subscriber.why_over
    assert "00000000000000aa" in subscriber.why_over and "0123456789abcdef" in subscriber.why_over
    assert subscriber.histories["https://s0"] == "0123456789abcdef"  # the one held: this life's updates go on naming it


@pytest.mark.slow
def test_a_relayed_learner_starts_over_with_a_synchronizer_that_lost_its_state(tmp_path: Path) -> None:
    """The relay forgets what it held and ends its stream; the learner, reading the relay's new history (or refused an
    update), starts over as a fresh learner of the new history and finishes the job."""
    with relayed(tmp_path, 1, 600_000) as (syncer, relay):
        procs = {"L0": start_learner(syncer, tmp_path, "L0", "east", relay, 0.03)}
        behind = lambda: relay.health()["subscribers"] == 1 and status_of(syncer)["rounds"] >= 3  # noqa: E731
        wait_until(behind, timeout_s=120, what="rounds with the learner behind the relay")
        syncer.kill()
        shutil.rmtree(syncer.job_dir / "state")
        syncer.start()
        summaries = finished(procs, tmp_path)
        final = status_of(syncer)
    lives = [json.loads(line) for line in (tmp_path / "L0.history.jsonl").read_text().splitlines()]
    assert [life["reason"] for life in lives] == [again.STARTED_OVER, "finished"]
    assert summaries["L0"]["restarts"] == 1 and summaries["L0"]["rejected_tokens"] == 0
    assert "the relay forgets every version it holds" in relay.log_path.read_text()
    assert final["ledger"]["merged"] > 0 and final["ledger"]["balanced"]


def test_a_relay_that_has_not_heard_a_shard_start_over_is_refused_until_it_lists_its_new_history(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A learner that started over registered with the shard's new history. Its relay, whose stream from that shard broke
    as the shard went down, still lists the old one and serves its versions: believed, the learner would take them, name
    the old history, and start over a second time as the relay caught up (a CI run saw two restarts). Its stream is
    refused (the learner takes nothing from it), the shard's own takes over, and the relay serves again once it lists
    the new history."""
    shown = [f"https://s0={OLD}", f"https://s0={OLD}", f"https://s0={NEW}"]

    def relist(relay: FakeShard) -> None:  # each stream ends; the relay hears the shard again on its third
        relay.listed = shown[min(len(relay.asked), 2)]
        relay.frames = [version_frame(0, 9 if OLD in relay.listed else 3)]  # the old history's versions ran higher

    caplog.set_level(logging.INFO, logger="ddctl_agents.agent.subscription")
    stopping = threading.Event()
    relay, shard = FakeShard([], breaks=True, on_open=relist), FakeShard([version_frame(0, 2)], history=NEW, hold=stopping)
    link = RelayLink("https://r", lambda url: relay)  # type: ignore[arg-type,return-value]
    subscriber = Subscriber(lambda url: shard, 1, stopping, lambda url: None, Counter(), relay=link)  # type: ignore[arg-type,return-value]
    subscriber.registered("https://s0", NEW)
    subscriber.versions = [-1]
    threads = [threading.Thread(target=target, daemon=True) for _, target in subscriber.loops(["https://s0"])]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: subscriber.versions == [3], timeout_s=10, what="the relay's version of the new history")
    finally:
        stopping.set()
    taken = [subscriber.inbox.get_nowait().version for _ in range(subscriber.inbox.qsize())]
    assert taken == [2, 3]  # the shard's own, then the relay's once it agreed: never the old history's 9
    assert not subscriber.started_over.is_set(), subscriber.why_over
    assert subscriber.histories == {"https://s0": NEW} and subscriber.agreed == {("https://r", "https://s0")}
    assert len(relay.asked) >= 3 and shard.asked == [[-1]]  # refused twice, then believed; the shard's stream opened once
    said = [r.getMessage() for r in caplog.records if "the shard's own stream is read until they agree" in r.getMessage()]
    assert len(said) == 1 and f"relay at https://r lists history {OLD} for https://s0, which named {NEW} itself" in said[0]


def test_a_relay_that_agreed_and_lists_another_history_heard_its_shard_start_over() -> None:
    """Once a relay's list has agreed with the shard's registration, a new history it lists is the shard's news (the
    relay heard it start over first-hand): the learner starts over, without asking the shard."""
    lists = iter([f"https://s0={OLD}", f"https://s0={NEW}"])

    def relist(relay: FakeShard) -> None:
        relay.listed = next(lists, f"https://s0={NEW}")

    stopping = threading.Event()
    relay = FakeShard([], breaks=True, on_open=relist)
    link = RelayLink("https://r", lambda url: relay)  # type: ignore[arg-type,return-value]
    shard = FakeShard([], history=NEW, hold=stopping)
    subscriber = Subscriber(lambda url: shard, 1, stopping, lambda url: None, Counter(), relay=link)  # type: ignore[arg-type,return-value]
    subscriber.registered("https://s0", OLD)
    subscriber.versions = [-1]
    thread = threading.Thread(target=subscriber.via_relay, args=(["https://s0"],), daemon=True)
    thread.start()
    try:
        assert subscriber.started_over.wait(timeout=10)
    finally:
        stopping.set()
    thread.join(timeout=10)
    assert "the synchronizer at https://s0 (as the relay at https://r lists it) started over" in subscriber.why_over
    assert subscriber.histories == {"https://s0": OLD}  # the one held: this life's updates go on naming it
    assert shard.asked == []  # no stream of the shard's was opened to learn it
