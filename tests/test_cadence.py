"""A learner that sends every k-th period: its schedule, what the syncer folds from it, what it is sent.

The unit tests pin each rule; the last two run a real syncer process over HTTP/2 + TLS
(a held learner's stream) and real learner processes (one at cadence 1, one at 2).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from builders import small_run, small_syncer, update_for
from ddctl_agents.agent.client import Refused, SyncerClient, Unavailable
from ddctl_agents.core.effects import Ack, Record
from ddctl_agents.core.holds import Holds
from ddctl_agents.core.messages import FragmentVersion, decode_fragment, encode_update
from ddctl_agents.core.schedule import CADENCES, check_cadence
from ddctl_agents.core.syncer_state import capture, restore
from ddctl_agents.errors import ConfigError
from ddctl_agents.service.log_records import JoinEntry
from ddctl_agents.service.recovery import apply_record
from ddctl_agents.service.wal import WalRecord
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.waiting import wait_until
from tests.service_harness import Job, small_job
from tests.test_service_http import make_update


@pytest.fixture(scope="module")
def assembly() -> Assembly:
    return Assembly.build(small_run())


@pytest.mark.parametrize("cadence", CADENCES)
def test_a_learner_at_cadence_k_sends_each_fragment_every_k_periods(assembly: Assembly, cadence: int) -> None:
    learner = assembly.new_learner(0, cadence=cadence)
    syncer = assembly.new_syncer()
    for p in range(assembly.fragmentation.count):
        learner.on_arrival(syncer.fragment_message(p))
    h, count = assembly.config.sync.inner_steps, assembly.fragmentation.count
    period = cadence * h
    assert sorted(s.due for s in learner.state) == [period - p * period // count for p in reversed(range(count))]  # staggered
    while 0 not in learner.due():
        learner.train_step()
    sent_at = learner.step
    assert learner.make_update(0).c_steps == sent_at  # k*H steps of drift in one update (its first: from the stagger)
    assert learner.state[0].due == sent_at + period  # no answer yet: again after k*H steps
    learner.train_step()
    frag = assembly.fragmentation.fragments[0]
    learner.on_arrival(FragmentVersion(fragment=0, version=1, tensors={t.name: torch.zeros(t.shape) for t in frag}))
    assert learner.state[0].due == sent_at + period  # the answer, adopted a step later, keeps the period


@pytest.mark.parametrize("bad", [0, 3, 16, -1, 2.0, "2", True])
def test_a_cadence_outside_the_allowed_is_refused_naming_them(assembly: Assembly, bad: object) -> None:
    with pytest.raises(ConfigError, match=r"cadence must be one of 1, 2, 4, 8 \(send every k\*H steps\)"):
        check_cadence(bad)
    with pytest.raises(ConfigError, match="cadence must be one of"):
        assembly.new_learner(0, cadence=bad)  # type: ignore[arg-type]
    syncer = small_syncer()
    with pytest.raises(ConfigError, match="cadence must be one of"):
        syncer.register(0.0, "L0", cadence=bad)  # type: ignore[arg-type]
    assert "L0" not in syncer.live  # refused before anything changed


def advance(syncer, fragment: int, times: int) -> None:  # type: ignore[no-untyped-def]
    """``times`` rounds of ``fragment`` closed by L0 alone (cadence 1)."""
    for _ in range(times):
        syncer.receive(0.0, update_for(syncer, "L0", fragment))
        syncer.close_round(0.0, fragment, "all_arrived", "test")


FOLDED = [(1, 1, 1, "late"), (1, 1, 2, "dropped"), (2, 1, 3, "late"), (2, 1, 4, "dropped"),
          (4, 1, 7, "late"), (4, 1, 8, "dropped"), (8, 1, 15, "late"), (8, 1, 16, "dropped"),
          (1, 0, 1, "dropped"), (2, 0, 1, "late"), (2, 0, 2, "dropped"), (4, 0, 3, "late"), (4, 0, 4, "dropped"),
          (8, 0, 7, "late"), (8, 0, 8, "dropped"), (8, None, 7, "late"), (8, None, 8, "dropped")]  # fmt: skip
"""(cadence k, max_behind, versions behind, what becomes of the update); None: the default (0)."""


@pytest.mark.parametrize(("cadence", "max_behind", "behind", "status"), FOLDED)
def test_a_learner_at_cadence_k_may_be_k_minus_1_plus_max_behind_times_k_versions_behind(
    cadence: int, max_behind: int | None, behind: int, status: str
) -> None:
    """Its base is k - 1 versions old by design (the rounds the others closed in its period), and max_behind counts
    its own periods beyond that: at cadence 1 and max_behind 1 the old rule, one version; by default (0) none."""
    syncer = small_syncer() if max_behind is None else small_syncer(max_behind=max_behind)
    syncer.register(0.0, "L0")
    syncer.register(0.0, "L1", cadence=cadence)
    advance(syncer, 0, behind)
    ack, _ = syncer.receive(0.0, update_for(syncer, "L1", 0, base=0))
    assert ack.status == status, ack.reason
    if status == "dropped":
        assert f"is {behind} behind {behind} (at most {cadence - 1 + (max_behind or 0) * cadence})" in ack.reason
        assert syncer.ledger.dropped == 400
    else:
        assert syncer.rounds[0].late["L1"].c_tokens == 400  # folded into the open round
        advance(syncer, 0, 1)
        assert syncer.ledger.late_merged == 400 and syncer.ledger.balanced


def test_a_learner_at_cadence_k_weighs_in_a_round_as_one_period_of_its_tokens() -> None:
    """Its update carries k periods of tokens to one round; weighed with all of them it took most of that round's
    step from a base k - 1 rounds old. Weighed by period, it weighs what one period of its work would: here exactly
    L0's (by default its staleness weighs it down further: the next test)."""
    syncer = small_syncer(late_weight="period")
    syncer.register(0.0, "L0")
    syncer.register(0.0, "L1", cadence=4)
    advance(syncer, 0, 3)
    ack, _ = syncer.receive(0.0, update_for(syncer, "L1", 0, base=0, c_steps=16, c_tokens=1600))
    assert ack.status == "late"
    held = capture(syncer)  # an open round with L1's contribution in it survives a snapshot as it was
    syncer.receive(0.0, update_for(syncer, "L0", 0, c_steps=4, c_tokens=400))
    record = next(e.entry for e in syncer.close_round(0.0, 0, "all_arrived", "test") if isinstance(e, Record))
    weights = {a["learner"]: a["weight"] for a in record["admitted"]}
    assert weights == {"L0": 400**2 / 4, "L1": 1600**2 / 16 / 4}
    assert weights["L0"] == weights["L1"]
    again = small_syncer(late_weight="period")
    restore(again, held)
    assert again.rounds[0].late["L1"].periods == 4 and again.rounds[0].late["L1"].weight == weights["L1"]


def test_by_default_a_late_update_counts_over_one_plus_the_versions_it_is_behind() -> None:
    """``late_weight: staleness`` (the default): L1 at cadence 4, three versions behind, weighs a quarter of what one
    period of its work weighs at ``period`` (the test above); L0, on time, as before; a late update of a learner at
    cadence 1 (where ``max_behind`` lets it merge) half; a snapshot keeps it. A weight that is none is refused."""
    syncer = small_syncer(max_behind=1)
    syncer.register(0.0, "L0")
    syncer.register(0.0, "L1", cadence=4)
    syncer.register(0.0, "L2")
    advance(syncer, 0, 3)
    assert syncer.receive(0.0, update_for(syncer, "L1", 0, base=0, c_steps=16, c_tokens=1600))[0].status == "late"
    assert syncer.receive(0.0, update_for(syncer, "L2", 0, base=2))[0].status == "late"
    held = capture(syncer)
    syncer.receive(0.0, update_for(syncer, "L0", 0, c_steps=4, c_tokens=400))
    syncer.receive(0.0, update_for(syncer, "L2", 0))  # on time too: the sum of its two is as old as the late one
    record = next(e.entry for e in syncer.close_round(0.0, 0, "all_arrived", "test") if isinstance(e, Record))
    weights = {a["learner"]: a["weight"] for a in record["admitted"]}
    assert weights == {"L0": 400**2 / 4, "L1": 1600**2 / 16 / 4 / 4, "L2": 800**2 / 8 / 2}
    again = small_syncer(max_behind=1)
    restore(again, held)
    assert again.rounds[0].late["L1"].stale == 3 and again.rounds[0].late["L1"].weight == weights["L1"]
    with pytest.raises(ConfigError, match="late_weight must be one of period, staleness, got 'newest'"):
        small_syncer(late_weight="newest")


def test_cadence_is_core_state_on_the_tape_in_snapshots_and_in_the_log() -> None:
    syncer = small_syncer()
    effects = syncer.register(1.0, "L1", incarnation=3, cadence=4)
    join = next(e.entry for e in effects if isinstance(e, Record))
    assert (join["type"], join["cadence"]) == ("join", 4)
    fresh = small_syncer()
    restore(fresh, capture(syncer))
    assert fresh.cadence == {"L1": 4}
    replayed = small_syncer()
    entry = JoinEntry(t=1.0, learner="L1", incarnation=3, start_step=0, cadence=4).model_dump()
    apply_record(replayed, WalRecord(meta=entry, payload=b""))
    assert replayed.cadence == {"L1": 4} and replayed.live == {"L1": 3}
    old = {k: v for k, v in entry.items() if k != "cadence"}  # a log written before cadences: every learner at 1
    apply_record(replayed, WalRecord(meta=old, payload=b""))
    assert replayed.cadence == {"L1": 1}


def test_the_grace_window_does_not_wait_for_a_learner_whose_period_is_not_over() -> None:
    """Before its first report a learner's next send is forecast at its own period, not H: a cadence-8 learner
    that sent at step 0 is not due for 32 steps, far outside any window."""
    syncer = small_syncer(grace=True)
    for name, k in (("L0", 1), ("L1", 8)):
        syncer.register(0.0, name, cadence=k)
        syncer.heartbeat(0.0, name, step=4, step_time=1.0)
        syncer.observe_link(name, "up", 1_000_000, 1.0)
    syncer.receive(0.5, update_for(syncer, "L0", 0))
    forecast = syncer._timing(0.5, 0).forecasts["L1"]  # noqa: SLF001 - the estimate behind the decision
    assert forecast > 0.5 + 8 * 4 - 8  # due at step 32 (8 x H=4, staggered), 28 steps of 1 s away
    assert syncer.poll(0.5)[0].entry["cause"] == "none_coming"  # type: ignore[union-attr]


def version(p: int, v: int) -> tuple[int, int]:
    return p, v


def test_holds_send_a_held_learner_its_bootstrap_then_one_version_per_push() -> None:
    holds = Holds()
    holds.joined("L1", 2)
    holds.joined("L0", 1)
    assert holds.held("L1") and not holds.held("L0")
    assert not holds.pushed("L0", 0, Ack(status="accepted", reason="", version=0), newest=5)  # nothing held from L0
    assert holds.wants("L1", 0, 0, seen=-1)  # bootstrap
    assert not holds.wants("L1", 0, 1, seen=0)  # someone else's round: held back
    assert holds.wants("L0", 0, 1, seen=0)  # a learner at cadence 1 gets every version
    assert not holds.pushed("L1", 0, Ack(status="late", reason="", version=3), newest=3)  # owed: one not made yet
    assert not holds.wants("L1", 0, 3, seen=0)  # the version it was answered with does not hold its update
    assert holds.wants("L1", 0, 4, seen=0)  # the first that can
    holds.sent("L1", 0)
    assert not holds.wants("L1", 0, 5, seen=4)  # one per push
    assert holds.pushed("L1", 0, Ack(status="accepted", reason="", version=5), newest=6)  # its round closed meanwhile
    assert holds.pushed("L1", 1, Ack(status="dropped", reason="", version=7), newest=7)  # too stale: resync now
    assert holds.wants("L1", 1, 7, seen=0)
    assert not holds.pushed("L1", 2, Ack(status="rejected", reason="", version=7, code="bad_update"), newest=9)
    assert not holds.wants("L1", 2, 8, seen=0)
    holds.joined("L1", 1)  # registered again at cadence 1: nothing held any more
    assert holds.wants("L1", 2, 8, seen=0)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    job = Job.create(tmp_path_factory.mktemp("cadence"), small_job(learners=2))
    job.start_syncer()
    yield job
    job.stop_all()


def test_a_cadence_the_syncer_does_not_allow_is_refused_with_what_is(job: Job) -> None:
    client = job.client("L1")
    try:
        with pytest.raises(Refused) as info:
            client.register("L1", 1, "r", cadence=3)
        assert info.value.status == 400 and "field 'cadence': Value error, must be one of 1, 2, 4, 8, got 3" in info.value.reason
        assert "L1" not in {e["id"] for e in job.status()["learners"]}
    finally:
        client.close()


HOSTILE = [3, 0, -1, 2**70, 2.0, 1e308, "2", None, True, [2], {"k": 2}]


def test_hostile_cadences_are_400s_and_the_syncer_carries_on(job: Job) -> None:
    """Huge, negative, float, overflowing, wrong-typed: each refused naming the field, none a 500 or a registration."""
    import json

    client = job.client("L0")
    try:
        for bad in HOSTILE:
            body = json.dumps({"learner": "L0", "incarnation": 1, "region": "r", "cadence": bad})
            answer = client.http.post(f"{job.url}/v1/register", content=body, headers={"content-type": "application/json"})
            assert answer.status_code == 400 and "cadence" in answer.json()["reason"], (bad, answer.text)
        truncated = client.http.post(f"{job.url}/v1/register", content=b'{"learner": "L0", "cadence": 2', headers={})
        assert truncated.status_code == 400
        assert "L0" not in {e["id"] for e in job.status()["learners"]}  # nothing registered on the way
        assert client.register("L0", 1, "r", cadence=4)["learner"] == "L0"  # a good one still gets in
        assert {e["id"]: e["cadence"] for e in job.status()["learners"]}["L0"] == 4
        client.register("L0", 1, "r")  # back at cadence 1, as the next test has it
    finally:
        client.close()


def test_a_held_learners_stream_carries_its_bootstrap_then_only_the_versions_it_adopts(job: Job) -> None:
    """Real HTTP/2 + TLS: L0 (cadence 1) closes rounds; L1 (cadence 2) is sent only what answers its own pushes."""
    assembly = Assembly.build(small_job(learners=2))
    l0, l1 = job.client("L0"), job.client("L1")
    l0.register("L0", 1, "r")
    l1.register("L1", 1, "r", cadence=2)
    got: list[tuple[int, int]] = []
    stop = threading.Event()

    def read(client: SyncerClient) -> None:
        try:
            for frame in client.fragments([-1] * 4):
                if frame:
                    message, _ = decode_fragment(frame)
                    got.append(version(message.fragment, message.version))
        except Unavailable:
            assert stop.is_set(), "L1's stream broke before the test ended"

    subscriber = job.client("L1")
    reader = threading.Thread(target=read, args=(subscriber,), daemon=True)
    reader.start()
    try:
        wait_until(lambda: len(got) >= 4, timeout_s=30, what="L1's bootstrap")
        assert sorted(got) == [(p, 0) for p in range(4)]

        def push(client: SyncerClient, learner: str, fragment: int, base: int) -> str:
            update = make_update(assembly, learner, fragment, base)
            return str(client.push(encode_update(update, "int4", 64), fragment)["status"])

        assert push(l0, "L0", 0, 0) == "accepted"
        wait_until(lambda: job.status()["versions"][0] == 1, timeout_s=30, what="L0's round")
        assert push(l1, "L1", 0, 0) == "late"  # one behind, its cadence's own allowance (k - 1): into the open round
        assert push(l0, "L0", 0, 1) == "accepted"
        wait_until(lambda: (0, 2) in got, timeout_s=30, what="the version holding L1's update")
        assert (0, 1) not in got  # L0's round was never sent to L1
        for base in range(4):  # fragment 1 four versions on: L1's push from 0 is too stale even at cadence 2
            assert push(l0, "L0", 1, base) == "accepted"
            wait_until(lambda b=base: job.status()["versions"][1] == b + 1, timeout_s=30, what="L0's rounds")
        assert [v for p, v in got if p == 1] == [0]
        assert push(l1, "L1", 1, 0) == "dropped"
        wait_until(lambda: (1, 4) in got, timeout_s=30, what="the resync version")
        assert sorted(got) == [(0, 0), (0, 2), (1, 0), (1, 4), (2, 0), (3, 0)]
        learners = {e["id"]: e for e in job.status()["learners"]}
        assert (learners["L0"]["cadence"], learners["L1"]["cadence"]) == (1, 2)
        admin = job.client()
        try:
            metrics = admin.metrics()
        finally:
            admin.close()
        assert 'ddctl_learner_cadence{learner="L0"} 1.0' in metrics and 'ddctl_learner_cadence{learner="L1"} 2.0' in metrics
    finally:
        stop.set()
        for client in (l0, l1, subscriber):
            client.close()
        reader.join(timeout=30)


@pytest.mark.slow
def test_a_learner_at_cadence_2_trains_with_half_the_traffic_and_every_token_is_accounted(tmp_path: Path) -> None:
    """Real processes: L1 sends every 2 periods; it moves about half L0's bytes each way, nothing it sends is
    dropped for staleness within the allowance of one period late (``max_behind: 1``; by default, 0, an update
    later than its cadence's own is dropped), and the books balance."""
    job = small_job(learners=2, tokens=200_000)
    job = Job.create(tmp_path, dataclasses.replace(job, syncer=dataclasses.replace(job.syncer, max_behind=1)))
    try:
        job.start_syncer()
        job.start_learner("L0")
        job.start_learner("L1", "--cadence", "2")
        job.wait_learners()
        status = job.wait_for(lambda s: s["ledger"]["pending"] == 0, 60, "the last rounds to close")
        fast, slow = job.summary("L0"), job.summary("L1")
        assert (fast["cadence"], slow["cadence"]) == (1, 2) and fast["step"] == slow["step"]
        up, down = slow["bytes_up"] / fast["bytes_up"], slow["bytes_down"] / fast["bytes_down"]
        assert 0.4 < up < 0.65, up  # half the updates, each the same size
        assert down < 0.75, down  # its bootstrap, then a version per push (L0 gets every round's)
        ledger = status["ledger"]
        assert ledger["balanced"] and ledger["dropped"] == 0
        assert ledger["received"] == fast["sent_tokens"] + slow["sent_tokens"]
        assert sum(slow["acked_tokens"].values()) == slow["sent_tokens"]
    finally:
        job.stop_all()


@pytest.mark.slow
def test_the_virtual_cluster_plays_a_learner_at_cadence_2_and_its_tape_replays_bit_for_bit(tmp_path: Path) -> None:
    """Deterministic: L2 sends every 2 periods (H = 8), gets a version per push, and the run balances and replays."""
    import json

    from ddctl.config.train import ClusterConfig
    from ddctl.local.replay import replay_tape
    from ddctl.local.training import train_decoupled

    path = tmp_path / "run.jsonl"
    run = train_decoupled(small_run(tokens=60_000, learners=3, cluster=ClusterConfig(cadences=(1, 1, 2))), path)
    assert run["ledger"]["balanced"] and run["ledger"]["dropped"] == 0
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert {r["learner"]: r["cadence"] for r in records if r["type"] == "join"} == {"L0": 1, "L1": 1, "L2": 2}
    updates = [r for r in records if r["type"] == "update" and r["status"] != "duplicate"]
    sends = {m: [r for r in updates if r["learner"] == m] for m in ("L0", "L2")}
    assert len(sends["L2"]) < 0.6 * len(sends["L0"])  # half the updates (its final flush is one of them)
    steady = [r["c_steps"] for r in sends["L2"][4:-4]]  # past the staggered first sends, before the final flush
    assert steady and min(steady) >= 8 + 1  # each carries more than one period of H = 8 steps
    adopted = [tuple(a[:2]) for r in sends["L2"] for a in r["adoptions"]]
    assert len(adopted) <= len(sends["L2"]) + 4  # a version per push, not one per round (plus its bootstrap's)
    replayed = replay_tape(path)
    assert replayed["match"] and replayed["params_sha256"] == run["params_sha256"]


@pytest.mark.parametrize(("text", "message"), [("1,3", r"cadences must each be one of \(1, 2, 4, 8\), got \(1, 3\)"),
                                               ("1,1", r"give one cadence per learner \(3\), got 2"),
                                               ("1,x,2", "--cadences '1,x,2' must be comma-separated integers")])  # fmt: skip
def test_ddctl_train_refuses_cadences_it_cannot_play(text: str, message: str) -> None:
    from typer.testing import CliRunner

    from ddctl.cli.app import app

    done = CliRunner().invoke(app, ["train", "--learners", "3", "--tokens", "20000", "--cadences", text, "--json"])
    assert done.exit_code == 2 and re.search(message, done.output), done.output
