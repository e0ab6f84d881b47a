from __future__ import annotations

import pytest
import torch

from builders import small_syncer, update_for
from ddctl_agents.core.effects import Record, Send
from ddctl_agents.errors import REJECTIONS, BadUpdate, ImpossibleVersion, NonFiniteUpdate, UnknownLearner


def joined(n: int = 2, **kw: object):  # type: ignore[no-untyped-def]
    s = small_syncer(**kw)  # type: ignore[arg-type]
    for i in range(n):
        s.register(0.0, f"L{i}")
    return s


def test_join_bootstraps_every_fragment_and_is_taped() -> None:
    s = small_syncer()
    effects = s.register(0.0, "L0", incarnation=2, start_step=40)
    sends = [e for e in effects if isinstance(e, Send)]
    assert [e.message.fragment for e in sends] == [0, 1] and all(e.to == ("L0",) for e in sends)
    record = next(e.entry for e in effects if isinstance(e, Record))
    assert record["type"] == "join" and record["start_step"] == 40 and record["vclock"]["syncer"] == 1


def test_k1_round_closes_on_the_first_update_and_broadcasts() -> None:
    s = joined()
    ack, _ = s.receive(1.0, update_for(s, "L0", 0))
    assert ack.status == "accepted"
    assert s.versions[0] == 0  # receive never closes a round by itself
    effects = s.poll(1.0)
    record = next(e.entry for e in effects if isinstance(e, Record))
    send = next(e for e in effects if isinstance(e, Send))
    assert s.versions[0] == 1 and send.to == ("L0", "L1") and send.message.version == 1
    assert "grace off" in record["reason"] and [a["learner"] for a in record["admitted"]] == ["L0"]
    # outer step: delta 1 everywhere, lr .7, nesterov .5 on a fresh buffer -> theta = 0 - .7*(1 + .5)
    assert torch.allclose(s.fragments[0][next(iter(s.fragments[0]))], torch.full((4,), -1.05))


def test_quorum_two_waits_for_the_second_learner() -> None:
    s = joined(quorum=2)
    s.receive(1.0, update_for(s, "L0", 0))
    assert s.poll(1.0) == []
    s.receive(2.0, update_for(s, "L1", 0))
    effects = s.poll(2.0)
    assert s.versions[0] == 1
    assert "all 2 live learners arrived" in next(e.entry for e in effects if isinstance(e, Record))["reason"]


def test_late_update_folds_into_the_next_round_and_too_stale_one_is_dropped() -> None:
    s = joined(n=3, max_behind=1)
    s.receive(1.0, update_for(s, "L0", 0))
    s.poll(1.0)
    ack, _ = s.receive(2.0, update_for(s, "L1", 0, base=0))
    assert ack.status == "late" and s.versions[0] == 1
    assert s.poll(2.0) == []  # late updates do not count toward the quorum
    s.receive(3.0, update_for(s, "L0", 0))
    effects = s.poll(3.0)
    admitted = next(e.entry for e in effects if isinstance(e, Record))["admitted"]
    assert {(a["learner"], a["late"]) for a in admitted} == {("L0", False), ("L1", True)}
    ack, effects = s.receive(4.0, update_for(s, "L2", 0, base=0))  # now 2 behind
    assert ack.status == "dropped"
    resync = [e for e in effects if isinstance(e, Send)]
    assert resync and resync[0].to == ("L2",) and resync[0].reason == "resync"
    assert s.ledger.balanced() and s.ledger.dropped == 400


def test_by_default_an_update_one_version_behind_is_dropped_and_its_learner_resynced() -> None:
    """max_behind 0: an update from a base the fragment has moved on from would step the direction the round before
    already took; it is dropped, counted, and its learner sent the fragment (docs/benchmarks.md)."""
    s = joined()
    s.receive(1.0, update_for(s, "L0", 0))
    s.poll(1.0)
    ack, effects = s.receive(2.0, update_for(s, "L1", 0, base=0))
    assert ack.status == "dropped" and "is 1 behind 1 (at most 0)" in ack.reason
    assert [e.to for e in effects if isinstance(e, Send) and e.reason == "resync"] == [("L1",)]
    assert s.rounds[0].late == {} and s.ledger.dropped == 400 and s.ledger.balanced()


def test_same_update_id_is_applied_once() -> None:
    s = joined()
    u = update_for(s, "L0", 0, update_id="L0.same")
    assert s.receive(1.0, u)[0].status == "accepted"
    assert s.receive(1.0, u)[0].status == "duplicate"
    assert s.ledger.received == 400


def test_two_updates_of_one_learner_in_one_round_add_up() -> None:
    s = joined(quorum=2)
    s.receive(1.0, update_for(s, "L0", 1, value=1.0, c_steps=2, c_tokens=200))
    s.receive(2.0, update_for(s, "L0", 1, value=2.0, c_steps=3, c_tokens=300))
    s.receive(3.0, update_for(s, "L1", 1, value=3.0))
    effects = s.poll(3.0)
    admitted = {a["learner"]: a for a in next(e.entry for e in effects if isinstance(e, Record))["admitted"]}
    assert (admitted["L0"]["c_steps"], admitted["L0"]["c_tokens"]) == (5, 500)


def test_ledger_balances_through_rounds() -> None:
    s = joined(n=2)
    for t in range(1, 6):
        s.receive(float(t), update_for(s, f"L{t % 2}", t % 2))
        s.poll(float(t))
    assert s.ledger.balanced() and s.ledger.pending == 0 and s.ledger.merged == 5 * 400


@pytest.mark.parametrize(
    ("make", "error", "status"),
    [
        (lambda s: update_for(s, "ghost", 0), UnknownLearner, 409),
        (lambda s: update_for(s, "L0", 0, base=5), ImpossibleVersion, 409),
    ],
)
def test_bad_updates_raise_with_their_http_status_and_change_nothing(make, error, status) -> None:  # type: ignore[no-untyped-def]
    s = joined()
    before = {k: v.clone() for k, v in s.global_params().items()}
    with pytest.raises(error) as info:
        s.receive(1.0, make(s))
    assert info.value.status == status
    assert s.ledger.received == 0 and all(torch.equal(before[k], v) for k, v in s.global_params().items())


@pytest.mark.parametrize(
    ("make", "error", "status"),
    [
        (lambda s: update_for(s, "L0", 0, value=float("nan")), NonFiniteUpdate, 422),
        (lambda s: update_for(s, "L0", 0, c_steps=0), BadUpdate, 400),
    ],
)
def test_bad_content_is_rejected_with_its_http_status_and_changes_nothing(make, error, status) -> None:  # type: ignore[no-untyped-def]
    s = joined()
    before = {k: v.clone() for k, v in s.global_params().items()}
    ack, effects = s.receive(1.0, make(s))
    assert ack.status == "rejected" and REJECTIONS[ack.code] is error and error(ack.reason).status == status
    assert [e.entry["status"] for e in effects if isinstance(e, Record)] == ["rejected"]
    assert s.ledger.received == 0 and all(torch.equal(before[k], v) for k, v in s.global_params().items())
    assert s.quarantine.standings["L0"].rejections == 1


def test_wrong_tensor_layout_is_a_bad_update() -> None:
    s = joined()
    u = update_for(s, "L0", 0)
    wrong = type(u)(**{**{f: getattr(u, f) for f in u.__slots__}, "tensors": {"zzz": torch.ones(4)}})  # type: ignore[attr-defined]
    ack, _ = s.receive(1.0, wrong)
    assert ack.status == "rejected" and REJECTIONS[ack.code] is BadUpdate and "holds" in ack.reason


def test_dead_learner_lowers_nothing_but_rounds_still_close() -> None:
    s = joined(n=2, quorum=2)
    s.receive(1.0, update_for(s, "L0", 0))
    assert s.poll(1.0) == []
    s.deregister(2.0, "L1", "heartbeat timeout")
    effects = s.poll(2.0)
    assert s.versions[0] == 1 and any(isinstance(e, Record) and e.entry["type"] == "round" for e in effects)


def test_the_duplicate_window_is_bounded_per_learner() -> None:
    from ddctl_agents.core.rounds import RecentIds

    recent = RecentIds(size=2)
    for update_id in ("a", "b", "c"):
        recent.add(update_id)
    assert "a" not in recent and "b" in recent and "c" in recent
    assert len(recent.ids) == len(recent.order) == 2


def test_late_updates_left_behind_by_departed_learners_are_merged() -> None:
    s = small_syncer(quorum=1, max_behind=1)
    for m in ("a", "b"):
        s.register(0.0, m)
    s.receive(1.0, update_for(s, "a", 0))
    s.poll(1.0)  # K=1: closes version 1 with a's update
    ack, _ = s.receive(2.0, update_for(s, "b", 0, base=0))  # b was one version behind
    assert ack.status == "late" and s.ledger.pending > 0
    assert s.poll(2.0) == []  # a late-only round waits for a fresh update while learners live
    s.deregister(3.0, "a", "left")
    s.deregister(3.0, "b", "left")
    effects = s.poll(3.0)
    rounds = [e.entry for e in effects if isinstance(e, Record) and e.entry["type"] == "round"]
    assert [r["cause"] for r in rounds] == ["final_drain"]
    assert s.ledger.pending == 0 and s.ledger.balanced() and s.versions[0] == 2


def test_a_learner_moves_only_its_own_and_other_known_learners_entries_of_the_syncers_clock() -> None:
    """A learner's update set the syncer's own entry to 2**70 (a hostile-input audit): it went out with every
    version and into every tape record. A learner cannot know more of the syncer's events than the syncer."""
    import dataclasses

    s = joined()
    ack, _ = s.receive(1.0, dataclasses.replace(update_for(s, "L1", 1), vclock={"L1": 2}))
    own = s.clock["syncer"]
    told = {"syncer": 10**6, "L0": 7, "L1": 5, "made-up": 3, "cut": 9}
    again, _ = s.receive(1.0, dataclasses.replace(update_for(s, "L0", 0), vclock=told))
    assert ack.status == again.status == "accepted"
    assert s.clock == {"L0": 7, "L1": 5, "syncer": own + 1}  # L1's, as L0 learned it through the syncer's versions
