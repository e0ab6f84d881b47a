"""The controller's shell against the fake provider: replacements, failover with a fault plan, and the reasons it records."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ddctl.control.controller import Controller, finished
from ddctl.control.state import InstanceRecord, State
from ddctl.providers.base import InstanceSpec
from ddctl.providers.fake import FakeProvider, Fault
from tests.builders import controller_world

RUN = "r"
ZONES = [{"provider": "fake", "cloud_region": "eu", "zone": z} for z in ("eu-a", "eu-b")] + [
    {"provider": "fake", "cloud_region": "us", "zone": ""}
]


def test_only_a_summary_that_says_finished_means_finished() -> None:
    assert finished(json.dumps({"reason": "finished"}).encode())
    assert finished(json.dumps({"reason": "stopped"}).encode())  # the job was stopped: nothing to replace
    assert not finished(json.dumps({"reason": "preemption_notice"}).encode())
    assert not finished(None)  # killed before it could write one
    assert not finished(b"{trunc")  # torn by a kill mid-write


@pytest.fixture
def world(tmp_path: Path) -> tuple[State, FakeProvider, Controller]:
    return controller_world(tmp_path, RUN, ZONES)


def events(state: State) -> list[dict]:
    return [e for e in state.events(RUN, 100) if e.get("kind") not in ("instance", "run-training")]


def test_nothing_is_done_while_everything_runs(world: tuple[State, FakeProvider, Controller]) -> None:
    state, fake, controller = world
    assert controller.once(now=0.0) == [] and fake.calls == []


def test_an_ended_learner_is_retired_and_replaced_a_finished_one_is_not_and_the_syncer_goes_first(
    world: tuple[State, FakeProvider, Controller],
) -> None:
    state, fake, controller = world
    fake.end(RUN, "L0")  # preempted: no summary
    fake.end(RUN, "L1", summary=json.dumps({"reason": "finished"}).encode())
    fake.end(RUN, "syncer")
    actions = controller.once(now=0.0)
    assert [(a.kind, a.name) for a in actions] == [
        ("retire", "syncer"),
        ("replace", "syncer"),
        ("retire", "L0"),
        ("replace", "L0"),
        ("retire", "L1"),
    ]
    assert [c for c in fake.calls if c[0] == "create"] == [("create", "syncer@eu/eu-a"), ("create", "L0@eu/eu-a")]
    records = {r.name: r for r in state.instances(RUN)}
    assert records["L1"].state == "finished" and records["L0"].state == "rejoining"
    replaced = [e for e in events(state) if e["kind"] == "replaced"]
    assert [e["instance"] for e in replaced] == ["syncer", "L0"] and all(
        "ended before its work was done" in e["reason"] for e in replaced
    )
    assert controller.once(now=1.0) == []  # converged: L1 stays finished, nothing to do


def test_failover_walks_zones_then_regions_with_every_step_in_the_event_log(
    world: tuple[State, FakeProvider, Controller],
) -> None:
    state, fake, controller = world
    fake.faults = [
        Fault(kind="capacity", scope="zone", code="InsufficientInstanceCapacity", cloud_region="eu", zone="eu-a"),
        Fault(kind="capacity", scope="zone", code="ZONE_RESOURCE_POOL_EXHAUSTED", cloud_region="eu", zone="eu-b"),
    ]
    fake.end(RUN, "L0")
    for now in (0.0, 1.0, 2.0):
        controller.once(now=now)
    assert [c[1] for c in fake.calls if c[0] == "create"] == ["L0@eu/eu-a", "L0@eu/eu-b", "L0@us/-"]
    failed = [e for e in events(state) if e["kind"] == "provision-failed"]
    assert [(e["error"], e["code"]) for e in failed] == [
        ("capacity", "InsufficientInstanceCapacity"),
        ("capacity", "ZONE_RESOURCE_POOL_EXHAUSTED"),
    ]
    replaced = next(e for e in events(state) if e["kind"] == "replaced")
    assert "eu/eu-a, eu/eu-b blocked, trying us" in replaced["reason"]
    record = next(r for r in state.instances(RUN) if r.name == "L0")
    assert record.detail["spec"]["cloud_region"] == "us"  # where it runs now is recorded


def test_a_quota_blocks_its_region_credentials_stop_the_cloud_and_the_reason_is_logged_once(
    world: tuple[State, FakeProvider, Controller],
) -> None:
    state, fake, controller = world
    fake.faults = [
        Fault(kind="quota", scope="region", code="VcpuLimitExceeded", cloud_region="eu"),
        Fault(kind="credentials", scope="cloud", code="AuthFailure", cloud_region="us"),
    ]
    fake.end(RUN, "L0")
    for now in (0.0, 1.0, 2.0, 3.0, 4.0):
        controller.once(now=now)
    assert [c[1] for c in fake.calls if c[0] == "create"] == ["L0@eu/eu-a", "L0@us/-"]  # eu-b is in the quota'd region
    gave_up = [e for e in events(state) if e["kind"] == "give_up"]
    assert len(gave_up) == 1 and "credentials (AuthFailure)" in gave_up[0]["reason"]  # said once, not every second


def test_transient_errors_back_off_and_then_succeed(world: tuple[State, FakeProvider, Controller]) -> None:
    state, fake, controller = world
    fake.faults = [Fault(kind="transient", scope="zone", code="RequestLimitExceeded", times=2)]
    fake.end(RUN, "L0")
    controller.once(now=0.0)
    retry_at = controller.memory.retry_at["L0"]
    controller.once(now=0.5)  # still backing off: no new attempt
    assert len([c for c in fake.calls if c[0] == "create"]) == 1 and 1.0 <= retry_at <= 2.0
    controller.once(now=retry_at)
    controller.once(now=controller.memory.retry_at["L0"])
    assert [c[1] for c in fake.calls if c[0] == "create"] == ["L0@eu/eu-a"] * 3  # same place: it was not the zone's fault
    assert next(r for r in state.instances(RUN) if r.name == "L0").state == "rejoining"
    assert any(e["kind"] == "wait" and "transient" in e["reason"] for e in events(state))


def test_a_learner_still_exiting_when_the_job_ends_is_recorded_as_finished_if_the_syncer_says_so(
    world: tuple[State, FakeProvider, Controller], tmp_path: Path
) -> None:
    """A multi-rank learner takes seconds to exit after its summary (torchrun's teardown): the end must not race it."""
    from ddctl.control.finish import RunResult, conclude

    state, fake, _ = world
    books = {
        "budget": 10,
        "planned": 10,
        "trained": 10,
        "received": 10,
        "merged": 10,
        "late_merged": 0,
        "dropped": 0,
        "rejected": 0,
        "pending": 0,
    }
    result = RunResult.model_validate(
        {
            "run": RUN, "reason": "finished", "finished_at": time.time(), "uptime_s": 1.0, "quorum_s": 0.0, "goodput": 0.5,
            "rounds": 3, "tokens": books, "val_bpb": 3.0, "bytes_up": 1, "bytes_down": 1,
            "learners_finished": ["L0"], "state_dir": str(tmp_path),
        }
    )  # fmt: skip
    conclude(RUN, state, result, str(tmp_path), owners=[fake])
    states = {r.name: r.state for r in state.instances(RUN)}
    assert states["L0"] == "finished"  # still running when the job ended, but the syncer counted its share done
    assert states["L1"] != "finished"  # not in the syncer's list: whatever it was, it did not finish


def test_a_learner_over_two_vms_is_replaced_as_one_node_0_first_and_the_other_meets_at_its_new_address(
    tmp_path: Path,
) -> None:
    from ddctl.control.specs import with_rendezvous

    state = State(tmp_path / "state.sqlite3")
    state.create_run(RUN, "regions.yaml", str(tmp_path / "job"), {})
    state.set_run_state(RUN, "training")
    fake = FakeProvider()
    hosts: list[str] = []  # node 0's private address, once it exists
    for node, name in enumerate(("L0", "L0-n1")):
        argv = ("agent", "--name", "L0", "--nodes", "2", "--rendezvous", "127.0.0.1:29400")
        spec = InstanceSpec(run=RUN, name=name, region="eu", role="learner", argv=argv, log=tmp_path / name, summary="/s")
        spec = with_rendezvous(spec, hosts[0]) if node else spec
        started = fake.create(spec)
        hosts.append(started.private_address)
        detail = {"spec": spec.to_json(), "placements": ZONES, "learner": "L0", "node": node}
        state.put_instance(InstanceRecord(RUN, name, "eu", "fake", "learner", "running", started.provider_id, 0.0, detail))
    controller = Controller(RUN, state, owners={"fake": fake})
    fake.calls.clear()
    fake.end(RUN, "L0-n1")  # its VM was preempted; L0's ranks would hang on it until a collective timeout
    actions = controller.once(now=0.0)
    assert [(a.kind, a.name) for a in actions] == [
        ("retire", "L0-n1"), ("terminate", "L0"), ("replace", "L0"), ("replace", "L0-n1")
    ]  # fmt: skip
    assert [c for c in fake.calls if c[0] in ("terminate", "create")] == [
        ("terminate", "L0"), ("create", "L0@eu/eu-a"), ("create", "L0-n1@eu/eu-a")
    ]  # fmt: skip
    now = {i.name: i for i in fake.list_run(RUN)}
    assert now["L0"].private_address != hosts[0]  # a new VM at a new address ...
    records = {r.name: r for r in state.instances(RUN)}
    told = records["L0-n1"].detail["spec"]["argv"]
    assert told[told.index("--rendezvous") + 1] == f"{now['L0'].private_address}:29400"  # ... where its peer meets it
    assert records["L0"].detail["learner"] == records["L0-n1"].detail["learner"] == "L0"  # still one learner
    lost = [e for e in events(state) if e["kind"] == "terminate"]
    assert [e["instance"] for e in lost] == ["L0"] and "replaced as one" in lost[0]["reason"]
    assert controller.once(now=1.0) == []  # whole again


def test_a_replaced_learner_is_pointed_at_its_regions_relay_host_as_it_is_now(tmp_path: Path) -> None:
    """``control/relays.py``: L0 hosts the region's relay; L1 reaches it at L0's address, also after either is replaced."""
    state = State(tmp_path / "state.sqlite3")
    state.create_run(RUN, "regions.yaml", str(tmp_path / "job"), {})
    state.set_run_state(RUN, "training")
    fake = FakeProvider()
    relay = ("--relay", "https://127.0.0.1:29401", "--relay-token-file", "/t")
    for name, role, argv in (("L0", "host", (*relay, "--host-relay", "0.0.0.0:29401")), ("L1", "served", relay)):
        spec = InstanceSpec(run=RUN, name=name, region="eu", role="learner", argv=("agent", *argv), log=tmp_path / name)
        started = fake.create(spec)
        detail = {"spec": spec.to_json(), "placements": ZONES, "relay": role}
        state.put_instance(
            InstanceRecord(RUN, name, "eu", "fake", "learner", "running", started.provider_id, time.time(), detail)
        )
    controller = Controller(RUN, state, owners={"fake": fake})

    def told(name: str) -> str:
        [record] = [r for r in state.instances(RUN) if r.name == name]
        argv = InstanceSpec.from_json(record.detail["spec"]).argv
        return argv[argv.index("--relay") + 1] if "--relay" in argv else ""

    def address(name: str) -> str:
        return next(i.private_address for i in fake.list_run(RUN) if i.name == name and i.alive)

    fake.end(RUN, "L1")
    controller.once(now=0.0)
    assert told("L1") == f"https://{address('L0')}:29401"
    old = address("L0")
    fake.end(RUN, "L0")  # both in one pass: the host first, and L1 is pointed at its new machine
    fake.end(RUN, "L1")
    controller.once(now=1000.0)  # L1's second end, after a life longer than a quick end's: replaced at once
    assert told("L0") == "https://127.0.0.1:29401"  # the host reaches its own relay on loopback
    assert told("L1") == f"https://{address('L0')}:29401" and address("L0") != old


def test_a_learner_that_finished_and_left_no_listing_is_not_started_again(
    tmp_path: Path, world: tuple[State, FakeProvider, Controller]
) -> None:
    """A process that ended is not listed (``ProcessProvider``): its exit summary on this machine says whether it
    trained its share. Before, such a learner was missing to ``reconcile`` and was started again before the job ended."""
    state, fake, controller = world
    for name, reason in (("L0", "finished"), ("L1", "sigterm")):
        [record] = [r for r in state.instances(RUN) if r.name == name]
        spec = InstanceSpec.from_json(record.detail["spec"])
        summary = tmp_path / f"{name}.summary.json"
        summary.write_text(json.dumps({"reason": reason}))
        state.put_instance(replace(record, detail={**record.detail, "spec": {**spec.to_json(), "summary": str(summary)}}))
        [instance] = [i for i in fake.list_run(RUN) if i.name == name]
        fake.terminate(instance)  # gone from the listing, as an ended process is
    fake.calls.clear()
    actions = controller.once(now=0.0)
    assert [(a.kind, a.name) for a in actions] == [("create", "L1")]  # L1 was stopped before its share: replaced
    assert {r.name: r.state for r in state.instances(RUN)}["L0"] == "finished"
    assert controller.once(now=1.0) == []  # and never again


def test_no_answer_ends_the_watch_and_a_forged_line_is_escaped(
    world: tuple[State, FakeProvider, Controller], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The loop caught only DdctlError: one DescribeInstances answer without ``State`` (a KeyError), a throttling
    ClientError or an engine answer of another shape ended the controller, and no lost learner was replaced again
    (found by a hostile-input audit of the cloud answers)."""
    import logging
    import threading

    from ddctl.control.controller import watch
    from ddctl.errors import DdctlError

    state, _, controller = world
    forged = AttributeError("'str' object has no attribute 'get'\n2026-05-01T00:00:00Z INFO the job finished\x1b[2J")
    script: list[BaseException | None] = [KeyError("State"), forged, DdctlError("engine restarting"), None, forged, None]
    calls: list[BaseException | None] = []
    stop = threading.Event()

    def once() -> None:
        calls.append(step := script[len(calls)])
        if len(calls) == len(script):
            state.set_run_state(RUN, "finished")  # the run leaves training: the watch ends on its own
        if step is not None:
            raise step

    monkeypatch.setattr(controller, "once", once)
    with caplog.at_level(logging.ERROR, logger="ddctl.control.controller"):
        watch(controller, 0.001, stop)
    assert calls == script  # every pass ran: none of the errors ended the loop
    escaped = "AttributeError: 'str' object has no attribute 'get'\\n2026-05-01T00:00:00Z INFO the job finished\\x1b[2J"
    errors = [e["message"] for e in state.events(RUN) if e["kind"] == "error"]
    assert errors == ["KeyError: 'State'", escaped, "engine restarting", escaped]
    lines = [line for message in caplog.messages for line in message.splitlines()]
    assert not any(line.startswith("2026-05-01") or "\x1b" in line for line in lines)  # no forged line, no escape code
    traced = [m for m in caplog.messages if escaped in m and 'File "' in m]
    assert len(traced) == 1 and "in once" in traced[0]  # the traceback once per message, its frames only
