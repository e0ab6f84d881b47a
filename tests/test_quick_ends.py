"""An agent that ends soon after each start (its settings or data fail it on any machine) is not replaced for ever:
its restarts back off from the second quick end in a row and stop at the fifth; a spot VM taken back once, or an
agent that lived long, is replaced at once as before."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from ddctl.control.controller import Controller
from ddctl.control.given_up import EndWithoutGivenUp, waiting_only_for_given_up
from ddctl.control.reconcile import DEFAULT, Desired, Memory, Observed, Placement, ended, reconcile
from ddctl.control.rundir import RunDir
from ddctl.control.state import GIVEN_UP, InstanceRecord, State
from ddctl.dashboard.render import render
from ddctl.dashboard.snapshot import SyncerView, build
from ddctl.dashboard.watch import run_records
from ddctl.providers.fake import FakeProvider
from ddctl_agents.errors import Unavailable
from tests.builders import controller_world

HERE = Placement(provider="fake", cloud_region="eu", zone="eu-a")
L0 = Desired(name="L0", role="learner", placements=(HERE,))
GONE = [Observed(name="L0", alive=False)]


def start(memory: Memory, now: float) -> tuple[str, str]:
    action = reconcile([L0], GONE, now=now, memory=memory)[-1]
    return action.kind, action.reason


def test_the_first_quick_end_is_replaced_at_once_and_an_end_is_counted_once_per_incarnation() -> None:
    memory = ended(Memory(), "L0", started_at=100.0, now=130.0)
    assert memory.quick_ends["L0"] == 1 and start(memory, 130.0)[0] == "replace"  # a spot VM taken back early
    assert ended(memory, "L0", started_at=100.0, now=140.0) == memory  # the same end, seen by the next pass


def test_quick_ends_in_a_row_back_off_doubling_then_give_up_and_a_long_life_resets_them() -> None:
    memory = ended(Memory(), "L0", started_at=0.0, now=60.0)  # the first quick end: replaced at once (above)
    now, waits = 60.0, []
    for n in range(2, 6):
        memory = ended(memory, "L0", started_at=now, now=now + 60.0)  # the next incarnation lives a minute too
        now += 60.0
        kind, reason = start(memory, now)
        if n == DEFAULT.max_quick_ends:
            assert (
                kind == "give_up" and "5 times in a row; not started again (see `ddctl logs L0`; `ddctl stop` ends" in reason
            ), reason
            break
        assert kind == "wait" and f"{n} times in a row, so it starts again at" in reason, reason
        waits.append(memory.restart_at["L0"] - now)
        now = memory.restart_at["L0"]
        assert start(memory, now)[0] == "replace"  # once its wait is over
    first = DEFAULT.restart_backoff_first_s  # 30 s, doubling, each with a jitter of 50-100%
    assert len(waits) == 3 and all(0.5 * first * 2**i <= w <= first * 2**i for i, w in enumerate(waits)), waits
    lived = ended(memory, "L0", started_at=now, now=now + DEFAULT.quick_end_s + 1)  # it trained, then was taken back
    assert lived.quick_ends["L0"] == 0 and "L0" not in lived.restart_at and start(lived, now + 700)[0] == "replace"


@pytest.fixture
def world(tmp_path: Path) -> tuple[State, FakeProvider, Controller]:
    return controller_world(tmp_path, "r", [{"provider": "fake", "cloud_region": "eu", "zone": "eu-a"}])


def test_a_learner_that_dies_at_each_start_costs_five_machines_then_is_given_up_once_in_the_log(
    world: tuple[State, FakeProvider, Controller],
) -> None:
    state, fake, controller = world
    now, created = 0.0, []
    while now < 3600.0:  # an hour of passes 5 s apart; L0's agent ends right after every start (a batch past memory)
        if any(i.name == "L0" and i.alive for i in fake.list_run("r")):
            fake.end("r", "L0")
        controller.once(now=now)
        created = [c for c in fake.calls if c == ("create", "L0@eu/eu-a")]
        now += 5.0
    assert len(created) == 4  # one at once, three after waits of 15-30, 30-60 and 60-120 s; then none
    given_up = [e for e in state.events("r", 1000) if e["kind"] == "give_up"]
    assert len(given_up) == 1 and "L0: its agent ended within 600s of its start 5 times in a row" in given_up[0]["reason"]
    waits = [e for e in state.events("r", 1000) if e["kind"] == "wait"]
    assert len(waits) == 3 and all("starts again at" in e["reason"] for e in waits)  # said once per wait, not per pass
    assert [c for c in fake.calls if c[0] == "create" and not c[1].startswith("L0")] == []  # the others untouched
    # what status shows: L0 given up (not rejoining, as its last replacement said), its reason in the event log
    assert {r.name: r.state for r in state.instances("r")}["L0"] == GIVEN_UP
    shown = build(run_records("r", state), SyncerView(None, None, "down"), now)
    assert {row["id"]: row["state"] for region in shown["regions"] for row in region["learners"]}["L0"] == "given up"
    out = io.StringIO()
    Console(file=out, width=250).print(render(shown, 250, 60))
    assert "L0: its agent ended within 600s of its start 5 times in a row; not started again" in out.getvalue()
    # a restarted controller (its memory gone) reads the give-up from L0's record: no machine, no second event
    restarted, calls = Controller("r", state, owners={"fake": fake}), len(fake.calls)
    for later in range(0, 600, 5):
        restarted.once(now=now + later)
    assert [c for c in fake.calls[calls:] if c[0] == "create"] == []
    assert [e["kind"] for e in state.events("r", 1000)].count("give_up") == 1
    assert {r.name: r.state for r in state.instances("r")}["L0"] == GIVEN_UP
    assert reconcile([replace(L0, given_up=True)], GONE, now=0.0)[-1].kind == "give_up"  # from a memory that saw no end


def test_a_learner_taken_back_after_a_long_life_is_replaced_at_once_every_time(
    world: tuple[State, FakeProvider, Controller],
) -> None:
    state, fake, controller = world
    for now in (0.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0):  # preempted every 1,000 s
        fake.end("r", "L0")
        controller.once(now=now)
    assert len([c for c in fake.calls if c == ("create", "L0@eu/eu-a")]) == 7
    assert not [e for e in state.events("r", 1000) if e["kind"] in ("wait", "give_up")]


def vm(name: str, state: str, **detail: object) -> InstanceRecord:
    return InstanceRecord("r", name, "eu", "fake", "learner", state, f"i-{name}", 0.0, dict(detail))


@pytest.mark.parametrize(
    ("records", "waiting_for"),
    [
        ([vm("L0", GIVEN_UP), vm("L1", "finished")], ["L0"]),
        ([vm("L0", GIVEN_UP), vm("L1", "running")], []),  # L1 still trains: the job goes on
        ([vm("L0", "finished"), vm("L1", "finished")], []),  # nothing given up: the syncer ends it itself
        ([vm("L0", GIVEN_UP), vm("L1", "finished", learner="L1", node=0), vm("L1-n1", "finished", learner="L1", node=1)], ["L0"]),
        (
            [vm("L0", "finished"), vm("L1", GIVEN_UP, learner="L1", node=0), vm("L1-n1", "rejoining", learner="L1", node=1)],
            ["L1"],
        ),
        ([vm("L0", GIVEN_UP), vm("L1", "finished", learner="L1", node=0), vm("L1-n1", "running", learner="L1", node=1)], []),
    ],
)
def test_the_job_waits_only_for_given_up_learners_once_every_other_one_finished(
    records: list[InstanceRecord], waiting_for: list[str]
) -> None:
    syncer = InstanceRecord("r", "syncer", "eu", "fake", "syncer", "running", "i-s", 0.0, {})
    assert waiting_only_for_given_up([syncer, *records]) == waiting_for


def test_once_the_others_finished_the_controller_asks_every_shard_to_stop_once(
    world: tuple[State, FakeProvider, Controller], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, fake, controller = world
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    RunDir("r").root.mkdir(parents=True)
    RunDir("r").shard_urls.write_text("https://10.0.0.1:8443 https://10.0.0.2:8443\n")
    asked: list[tuple[str, str]] = []
    answers = iter([Unavailable("GET: ConnectError"), True, True])  # S0 does not answer at first

    def ask(run: str, url: str, reason: str) -> bool:
        asked.append((url, reason))
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    controller.ending = EndWithoutGivenUp(ask)
    fake.end("r", "L1", summary=json.dumps({"reason": "finished"}).encode())
    now = 0.0
    while now < 3600.0:  # L0's agent ends right after every start, as above, until it is given up
        if any(i.name == "L0" and i.alive for i in fake.list_run("r")):
            fake.end("r", "L0")
        controller.once(now=now)
        now += 5.0
    reason = "L0 given up (see the event log); every other learner finished its share"
    s0, s1 = "https://10.0.0.1:8443", "https://10.0.0.2:8443"
    assert asked == [(s0, reason), (s1, reason), (s0, reason)]  # S0 again on the next pass; then neither again
    assert [e["reason"] for e in state.events("r", 1000) if e["kind"] == "stop"] == [reason]  # said once
