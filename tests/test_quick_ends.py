"""An agent that ends soon after each start (its settings or data fail it on any machine) is not replaced for ever:
its restarts back off from the second quick end in a row and stop at the fifth; a spot VM taken back once, or an
agent that lived long, is replaced at once as before."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from ddctl.control.controller import Controller
from ddctl.control.reconcile import DEFAULT, Desired, Memory, Observed, Placement, ended, reconcile
from ddctl.control.state import GIVEN_UP, State
from ddctl.dashboard.render import render
from ddctl.dashboard.snapshot import SyncerView, build
from ddctl.dashboard.watch import run_records
from ddctl.providers.fake import FakeProvider
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


def test_a_learner_taken_back_after_a_long_life_is_replaced_at_once_every_time(
    world: tuple[State, FakeProvider, Controller],
) -> None:
    state, fake, controller = world
    for now in (0.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0):  # preempted every 1,000 s
        fake.end("r", "L0")
        controller.once(now=now)
    assert len([c for c in fake.calls if c == ("create", "L0@eu/eu-a")]) == 7
    assert not [e for e in state.events("r", 1000) if e["kind"] in ("wait", "give_up")]
