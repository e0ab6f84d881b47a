"""What a learner adopts from a synchronizer shard or relay: only versions that fit its fragments, numbered plausibly,
with clocks of the job's own processes, and each at most once (audit F1, F2, F3, F8)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from builders import small_run
from ddctl_agents.agent.loop import StepLoop, most_ahead
from ddctl_agents.agent.subscription import MOST_AHEAD, Subscriber
from ddctl_agents.core import vclock
from ddctl_agents.core.messages import FragmentVersion, Update
from ddctl_agents.core.wire import pack
from ddctl_agents.errors import WireError
from ddctl_agents.relay.feed import Feed
from ddctl_agents.service.publisher import Publisher
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.learner import Learner
from ddctl_agents.train.ranks import Decisions, Ranks


@pytest.fixture(scope="module")
def assembly() -> Assembly:
    return Assembly.build(small_run())


class Counted:
    def __init__(self) -> None:
        self.nbytes = 0

    def came_down(self, nbytes: int) -> None:
        self.nbytes += nbytes


def subscriber(a: Assembly, specs: bool = True) -> Subscriber:
    s = Subscriber(lambda url: None, 1, threading.Event(), lambda url: None, Counted())  # type: ignore[arg-type,return-value]
    s.versions = [-1] * a.fragmentation.count
    if specs:
        s.expect(a.fragmentation.fragments, MOST_AHEAD)
    return s


def good(a: Assembly, p: int) -> dict[str, torch.Tensor]:
    return {spec.name: a.initial[spec.name].clone() for spec in a.fragmentation.fragments[p]}


def frame(p: int, version: int, tensors: dict[str, torch.Tensor], clock: dict[str, int] | None = None) -> bytes:
    return pack("fragment", {"fragment": p, "version": version, "vclock": clock or {}}, tensors, "fp32")


def wrong_tensors(a: Assembly) -> dict[str, dict[str, torch.Tensor]]:
    names = [spec.name for spec in a.fragmentation.fragments[0]]
    return {
        "renamed": {"bogus": torch.zeros(4)},
        "one missing": {n: a.initial[n].clone() for n in names[1:]},
        "too few values": {n: torch.zeros(3) for n in names},
        "same count, other shape": {n: torch.zeros(a.initial[n].numel()) for n in names},
    }


class Leader:
    """Hands over what it is given, and has the comms' subscriber (which the loop tells what to expect)."""

    def __init__(self, a: Assembly) -> None:
        self.queue: list[FragmentVersion] = []
        self.subscriber = subscriber(a, specs=False)

    def arrivals(self) -> list[FragmentVersion]:
        out, self.queue = self.queue, []
        return out

    def send(self, update: Update) -> None:
        pass


def loop_of(a: Assembly) -> tuple[StepLoop, Leader, Learner]:
    learner, leader = a.new_learner(0), Leader(a)
    return StepLoop(learner, Decisions(Ranks(), 1 + 2 * a.fragmentation.count), leader), leader, learner


# -- F1: tensors that are not the fragment's ---------------------------------------------------------------------------
def test_the_stream_refuses_a_version_whose_tensors_are_not_the_fragments(assembly: Assembly) -> None:
    s = subscriber(assembly)
    for n, (label, tensors) in enumerate(wrong_tensors(assembly).items()):
        with pytest.raises(WireError):
            s._take(frame(0, 10 + n, tensors), keep_base=False)
        assert s.inbox.empty(), label
        assert s.versions[0] == -1, label  # the real version is still asked for
    assert s.refused == len(wrong_tensors(assembly))
    s._take(frame(0, 10, good(assembly, 0)), keep_base=False)
    assert s.inbox.get_nowait().version == 10


def test_the_loop_refuses_such_a_version_and_trains_on(assembly: Assembly, caplog: pytest.LogCaptureFixture) -> None:
    loop, leader, learner = loop_of(assembly)
    leader.queue = [FragmentVersion(fragment=0, version=5 + n, tensors=t) for n, t in enumerate(wrong_tensors(assembly).values())]
    leader.queue.append(FragmentVersion(fragment=99, version=1, tensors={}))
    leader.queue.append(FragmentVersion(fragment=0, version=1, tensors=good(assembly, 0)))
    loop._collect()
    assert loop.refused == 5 and [m.version for m in loop._held.values()] == [1]
    assert sum("refused version" in r.message for r in caplog.records) == 5  # once each
    for p in range(1, assembly.fragmentation.count):
        leader.queue.append(FragmentVersion(fragment=p, version=1, tensors=good(assembly, p)))
    assert loop.bootstrap(lambda: None) and learner.ready
    loop.run(learner.step + 1)
    assert learner.step == 1


def test_the_loop_tells_the_comms_subscriber_what_to_expect(assembly: Assembly) -> None:
    loop, leader, learner = loop_of(assembly)
    assert leader.subscriber.specs == assembly.fragmentation.fragments
    assert leader.subscriber.most_ahead == most_ahead(learner) == vclock.MOST_LEARNERS * (learner.total_steps + 2)
    with pytest.raises(WireError):
        leader.subscriber._take(frame(0, 3, wrong_tensors(assembly)["same count, other shape"]), keep_base=False)


# -- F2: a version numbered implausibly far ahead ----------------------------------------------------------------------
def test_a_version_far_ahead_of_the_held_one_is_refused_and_a_long_jump_is_not(assembly: Assembly) -> None:
    s = subscriber(assembly)
    s._take(frame(0, 10, good(assembly, 0)), keep_base=False)
    with pytest.raises(WireError, match="ahead"):
        s._take(frame(0, 2**62 - 1, good(assembly, 0)), keep_base=False)
    assert s.versions[0] == 10 and s.refused == 1
    s._take(frame(0, 10 + MOST_AHEAD, good(assembly, 0)), keep_base=False)  # a long disconnection
    assert s.versions[0] == 10 + MOST_AHEAD
    assert [s.inbox.get_nowait().version for _ in range(2)] == [10, 10 + MOST_AHEAD]


def test_the_loop_does_not_adopt_a_version_far_ahead(assembly: Assembly) -> None:
    loop, leader, learner = loop_of(assembly)
    count = assembly.fragmentation.count
    leader.queue = [FragmentVersion(fragment=p, version=10, tensors=good(assembly, p)) for p in range(count)]
    assert loop.bootstrap(lambda: None)
    far = 10 + most_ahead(learner)
    leader.queue = [FragmentVersion(fragment=0, version=far + 1, tensors=good(assembly, 0))]
    loop._collect()
    assert loop.refused == 1 and not loop._held
    leader.queue = [FragmentVersion(fragment=0, version=far, tensors=good(assembly, 0))]
    loop._collect()
    assert loop._held[0].version == far


# -- F3: clocks with made-up processes ---------------------------------------------------------------------------------
def test_only_the_jobs_processes_enter_a_learners_clock(assembly: Assembly) -> None:
    learner = assembly.new_learner(0)
    for p in range(assembly.fragmentation.count):
        learner.on_arrival(FragmentVersion(fragment=p, version=1, tensors=good(assembly, p)))
    for k in range(3):
        junk = {f"x{k}-{i}\n": 2**53 - 1 for i in range(4096)}
        clock = {**junk, "L1": 7, "S0": 3, vclock.SYNCER: 4, vclock.CUT: 2, "L64": 9, "S0\n": 1}
        assert learner.on_arrival(FragmentVersion(fragment=1, version=2 + k, tensors=good(assembly, 1), vclock=clock)) is None
    adoptions = assembly.fragmentation.count + 3  # each counts as one of its own events
    assert learner.clock == {"L0": adoptions, "L1": 7, "S0": 3, vclock.SYNCER: 4, vclock.CUT: 2}


def test_a_clock_keeps_a_bounded_number_of_shards() -> None:
    clock = {f"S{i}": 1 for i in range(1000)} | {f"L{i}": 1 for i in range(100)} | {"syncer": 1, "cut": 1, "": 1}
    kept = vclock.own(clock)
    assert len(kept) == vclock.MOST_LEARNERS + vclock.MOST_SHARDS + 2
    assert "L63" in kept and "L64" not in kept and "L01" not in vclock.own({"L01": 1})


# -- F8: duplicates and stale versions ---------------------------------------------------------------------------------
def test_a_version_already_held_or_older_is_not_queued_again(assembly: Assembly) -> None:
    s = subscriber(assembly)
    f = frame(0, 5, good(assembly, 0))
    for _ in range(50):
        s._take(f, keep_base=False)
    s._take(frame(0, 4, good(assembly, 0)), keep_base=False)
    assert s.inbox.qsize() == 1 and s.versions[0] == 5
    assert s.counted.nbytes == 51 * len(f)  # type: ignore[attr-defined]  # still counted: they came down


def test_a_relay_drops_a_version_far_ahead_and_keeps_taking_real_ones(assembly: Assembly) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:

        async def make() -> Publisher:
            return Publisher(4)

        publisher = asyncio.run_coroutine_threadsafe(make(), loop).result()
        feed = Feed(["http://s0"], lambda url: None, publisher, fragments=4, stale_after_s=15)  # type: ignore[arg-type,return-value]
        for version in (10, 2**62 - 1, 11):
            feed._publish("http://s0", frame(0, version, {"w": torch.ones(8)}), loop)
        assert publisher.versions() == [11, -1, -1, -1] and feed.counts.refused == 1
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
