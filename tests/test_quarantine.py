"""Quarantine the sender, not the job; and one fragment's fault never stops the other fragments."""

from __future__ import annotations

import pytest
import torch

from builders import small_syncer, update_for
from ddctl_agents.core.config import TrustConfig
from ddctl_agents.core.effects import Fault, Record
from ddctl_agents.core.quarantine import Quarantine
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.core.syncer_state import capture, load, restore
from ddctl_agents.errors import Suspended


def joined(n: int = 2, **kw: object) -> Synchronizer:
    s = small_syncer(**kw)  # type: ignore[arg-type]
    for i in range(n):
        s.register(0.0, f"L{i}")
    return s


def test_a_learner_is_suspended_after_max_rejections_and_readmitted_clean() -> None:
    q = Quarantine(max_rejections=2)
    assert q.flag("L3", "nan") is False and q.suspension("L3") is None
    assert q.flag("L3", "too big") is True and "2 rejected updates, the last: too big" in str(q.suspension("L3"))
    assert q.flag("L3", "again") is False  # already suspended: suspends once
    assert q.suspended() == ["L3"]
    assert q.readmit("L3") is True and q.suspension("L3") is None and "L3" not in q.standings
    assert q.readmit("L3") is False


def test_zero_never_suspends() -> None:
    q = Quarantine(max_rejections=0)
    assert not any(q.flag("L0", "bad") for _ in range(100)) and q.suspended() == []


def test_a_suspended_learner_leaves_the_quorum_and_is_refused_until_readmitted() -> None:
    s = joined(trust=TrustConfig(max_rejections=2))
    nan = update_for(s, "L1", 0, value=float("nan"))
    assert s.receive(1.0, nan)[0].status == "rejected" and "L1" in s.live
    ack, effects = s.receive(1.0, update_for(s, "L1", 0, value=float("inf")))
    assert ack.status == "rejected" and "L1" not in s.live
    kinds = [e.entry["type"] for e in effects if isinstance(e, Record)]
    assert kinds == ["update", "leave", "suspend"]
    with pytest.raises(Suspended, match="ddctl syncer readmit L1") as info:
        s.receive(2.0, update_for(s, "L1", 0))
    assert info.value.status == 403
    with pytest.raises(Suspended):
        s.register(2.0, "L1")
    # the others never notice: L0 alone closes rounds at K=1
    s.receive(2.0, update_for(s, "L0", 0))
    s.poll(2.0)
    assert s.versions[0] == 1 and s.ledger.balanced()
    assert [e.entry["type"] for e in s.readmit(3.0, "L1") if isinstance(e, Record)] == ["readmit"]
    assert s.readmit(3.0, "L1") == []
    s.register(3.0, "L1")
    assert s.receive(4.0, update_for(s, "L1", 1))[0].status == "accepted"


def test_standing_survives_a_snapshot() -> None:
    s = joined(trust=TrustConfig(max_rejections=2))
    for value in (float("nan"), float("nan")):
        s.receive(1.0, update_for(s, "L1", 0, value=value))
    s.receive(1.0, update_for(s, "L0", 1, value=float("nan")))
    s.degraded[1] = "a fault"
    s.faults[1] = 3
    back = small_syncer(trust=TrustConfig(max_rejections=2))
    restore(back, load(capture(s).to_bytes()))
    assert back.quarantine.suspended() == ["L1"] and back.quarantine.standings["L0"].rejections == 1
    assert back.degraded == {1: "a fault"} and back.faults == [0, 3]
    assert back.ledger.as_dict() == s.ledger.as_dict()


def test_a_fault_in_one_fragment_costs_that_round_only(monkeypatch: pytest.MonkeyPatch) -> None:
    s = joined()
    original = s._outer_step

    def broken(p: int, contributions):  # type: ignore[no-untyped-def]
        if p == 0:
            raise RuntimeError("a bug in fragment 0")
        return original(p, contributions)

    monkeypatch.setattr(s, "_outer_step", broken)
    for p in (0, 1):
        s.receive(1.0, update_for(s, "L0", p))
    effects = s.poll(1.0)
    faults = [e for e in effects if isinstance(e, Fault)]
    assert [f.fragment for f in faults] == [0] and isinstance(faults[0].error, RuntimeError)
    assert "a bug in fragment 0" in s.degraded[0] and s.faults == [1, 0]
    assert s.versions == [0, 1]  # fragment 1 merged regardless
    assert s.ledger.rejected == 400 and s.ledger.merged == 400 and s.ledger.balanced()
    assert s.open_rounds() == []  # the failed round was set aside, not left to fail forever
    monkeypatch.setattr(s, "_outer_step", original)
    s.receive(2.0, update_for(s, "L0", 0))
    s.poll(2.0)
    assert s.versions[0] == 1 and 0 not in s.degraded  # a clean round clears the mark


def test_a_grace_estimate_that_fails_decides_without_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    s = joined(grace=True)

    def overflow(now: float, p: int) -> None:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(s, "_timing", overflow)
    s.receive(1.0, update_for(s, "L0", 0))
    effects = s.poll(1.0)
    assert s.versions[0] == 1 and any(isinstance(e, Fault) for e in effects)
    assert "deciding without grace" in s.degraded[0] and s.ledger.merged == 400
    assert torch.isfinite(s.fragments[0][next(iter(s.fragments[0]))]).all()


def test_made_up_processes_in_a_vector_clock_are_not_adopted() -> None:
    s = joined()
    u = update_for(s, "L0", 0)
    forged = type(u)(**{**{f: getattr(u, f) for f in u.__slots__}, "vclock": {"L0": 3, f"ghost{7}": 9, "syncer": 1}})  # type: ignore[attr-defined]
    s.receive(1.0, forged)
    assert "ghost7" not in s.clock and s.clock["L0"] == 3
