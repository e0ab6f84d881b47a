"""The controller's decision, pure: create, replace, retire, terminate, wait, give up, each with its reason; failover."""

from __future__ import annotations

import pytest

from ddctl.control.reconcile import (
    Action,
    Desired,
    FailoverConfig,
    Memory,
    Observed,
    Placement,
    backoff,
    reconcile,
    remember,
)
from ddctl.errors import ProvisionError

A1, A2 = (
    Placement(provider="aws", cloud_region="us-east-1", zone="a"),
    Placement(provider="aws", cloud_region="us-east-1", zone="b"),
)
W = Placement(provider="aws", cloud_region="us-west-2")
PLACES = (A1, A2, W)


def learner(name: str = "L0", **kw: object) -> Desired:
    return Desired(name=name, role="learner", placements=PLACES, **kw)  # type: ignore[arg-type]


def syncer() -> Desired:
    return Desired(name="syncer", role="syncer", placements=(A1,))


def kinds(actions: list[Action]) -> list[tuple[str, str]]:
    return [(a.kind, a.name) for a in actions]


def test_a_new_run_creates_everything_syncer_first_at_the_first_placement() -> None:
    actions = reconcile([learner("L1"), learner("L0"), syncer()], [], now=0.0)
    assert kinds(actions) == [("create", "syncer"), ("create", "L0"), ("create", "L1")]
    assert all(a.placement == A1 and "is in the plan and not running" in a.reason for a in actions)


def test_what_runs_is_left_alone_and_what_ended_is_retired_then_replaced() -> None:
    observed = [Observed(name="syncer", alive=True), Observed(name="L0", alive=False), Observed(name="L1", alive=True)]
    actions = reconcile([syncer(), learner("L0"), learner("L1")], observed, now=0.0)
    assert kinds(actions) == [("retire", "L0"), ("replace", "L0")]
    assert "ended before its work was done" in actions[1].reason


def test_a_finished_learner_is_never_replaced_and_orphans_are_terminated() -> None:
    observed = [Observed(name="L0", alive=False, finished=True), Observed(name="L9", alive=True)]
    actions = reconcile([learner("L0"), learner("L1", done=True)], observed, now=0.0)
    assert kinds(actions) == [("terminate", "L9"), ("retire", "L0")]
    assert "not part of the run's plan" in actions[0].reason and "finished its work" in actions[1].reason


def test_down_is_reconcile_with_nothing_desired() -> None:
    observed = [Observed(name=n, alive=True) for n in ("L0", "syncer")]
    assert kinds(reconcile([], observed, now=0.0)) == [("terminate", "L0"), ("terminate", "syncer")]


def error(kind: str, scope: str, where: Placement, code: str = "X") -> ProvisionError:
    return ProvisionError(
        "no",
        kind=kind,
        scope=scope,
        code=code,
        provider=where.provider,
        region=where.cloud_region,
        zone=where.zone,  # type: ignore[arg-type]
    )


def test_capacity_fails_over_zone_then_region_and_the_block_expires() -> None:
    memory = Memory()
    first = reconcile([learner()], [], now=0.0, memory=memory)[0]
    memory = remember(memory, first, error("capacity", "zone", A1, "InsufficientInstanceCapacity"), now=0.0)
    second = reconcile([learner()], [], now=1.0, memory=memory)[0]
    assert second.placement == A2 and "us-east-1/a blocked, trying us-east-1/b" in second.reason
    memory = remember(memory, second, error("capacity", "zone", A2), now=1.0)
    third = reconcile([learner()], [], now=2.0, memory=memory)[0]
    assert third.kind == "create" and third.placement == W  # the next region the file allows
    later = reconcile([learner()], [], now=FailoverConfig().capacity_block_s + 5, memory=memory)[0]
    assert later.placement == A1  # the zone's block expired: back to the first choice


def test_quota_blocks_its_whole_region_and_credentials_stop_the_cloud() -> None:
    memory = remember(Memory(), reconcile([learner()], [], now=0.0)[0], error("quota", "region", A1), now=0.0)
    action = reconcile([learner()], [], now=1.0, memory=memory)[0]
    assert action.placement == W  # both zones of us-east-1 are out
    memory = remember(memory, action, error("credentials", "region", W, "AuthFailure"), now=1.0)
    gave_up = reconcile([learner()], [], now=10_000.0, memory=memory)[0]
    assert gave_up.kind == "give_up" and "credentials (AuthFailure)" in gave_up.reason  # for good, past every expiry


def test_transient_errors_back_off_with_jitter_then_retry_the_same_place() -> None:
    memory = Memory()
    action = reconcile([learner()], [], now=0.0)[0]
    for attempt in range(1, 4):
        memory = remember(memory, action, error("transient", "zone", A1, "RequestLimitExceeded"), now=0.0)
        waiting = reconcile([learner()], [], now=0.0, memory=memory)[0]
        assert waiting.kind == "wait" and "transient" in waiting.reason
        assert reconcile([learner()], [], now=memory.retry_at["L0"] - 0.5, memory=memory)[0] == waiting  # one per wait
        assert 0.5 * 2 ** (attempt - 1) * 2 <= memory.retry_at["L0"] <= 2 ** (attempt - 1) * 2
    retry = reconcile([learner()], [], now=memory.retry_at["L0"], memory=memory)[0]
    assert retry.kind == "create" and retry.placement == A1
    assert "L0" not in remember(memory, retry, None, now=100.0).retry_at  # success clears the backoff


def test_backoff_is_capped_and_deterministic() -> None:
    assert backoff("L0", 3) == backoff("L0", 3) and backoff("L0", 3) != backoff("L1", 3)
    assert backoff("L0", 50) <= FailoverConfig().backoff_max_s


def test_every_placement_blocked_waits_for_the_soonest_expiry() -> None:
    memory = Memory()
    for place in PLACES:
        memory = remember(
            memory, Action(kind="create", name="L0", reason="", placement=place), error("capacity", "zone", place), now=0.0
        )
    action = reconcile([learner()], [], now=10.0, memory=memory)[0]
    assert action.kind == "wait" and "every placement is blocked" in action.reason and "next try at 00:10:00 UTC" in action.reason
    assert reconcile([learner()], [], now=400.0, memory=memory)[0] == action  # one reason per wait: said once in the log


def test_a_request_refused_as_invalid_is_given_up_after_three_tries() -> None:
    memory = Memory()
    for _ in range(3):
        memory = remember(memory, reconcile([learner()], [], now=0.0, memory=memory)[0], error("config", "zone", A1), now=0.0)
    action = reconcile([learner()], [], now=0.0, memory=memory)[0]
    assert action.kind == "give_up" and "refused as invalid 3 times" in action.reason


@pytest.mark.parametrize("scope", ["zone", "region", "cloud"])
def test_blocks_match_their_scope(scope: str) -> None:
    memory = remember(Memory(), Action(kind="create", name="L0", reason="", placement=A1), error("capacity", scope, A1), now=0.0)
    [block] = memory.blocks
    assert A1.blocked_by(block)
    assert A2.blocked_by(block) == (scope != "zone")
    assert W.blocked_by(block) == (scope == "cloud")


def gang(nodes: int = 3, **kw: object) -> list[Desired]:
    """One learner over ``nodes`` VMs: L0, L0-n1, ..."""
    return [learner("L0" if k == 0 else f"L0-n{k}", group="L0", node=k, **kw) for k in range(nodes)]


def test_a_learner_over_several_vms_starts_node_0_first_and_all_at_one_placement() -> None:
    members = list(reversed(gang()))  # the order they are listed in does not matter
    actions = reconcile([syncer(), *members], [], now=0.0)
    assert kinds(actions) == [("create", "syncer"), ("create", "L0"), ("create", "L0-n1"), ("create", "L0-n2")]
    assert {a.placement for a in actions[1:]} == {A1} and "(node 2 of L0)" in actions[3].reason


def test_one_lost_vm_takes_the_learners_others_down_and_all_are_started_again() -> None:
    """Its ranks are one torchrun job: the survivors would only wait out a collective timeout."""
    observed = [Observed(name="L0", alive=True), Observed(name="L0-n1", alive=False), Observed(name="L0-n2", alive=True)]
    actions = reconcile(gang(), observed, now=0.0)
    assert kinds(actions) == [
        ("retire", "L0-n1"),
        ("terminate", "L0"),
        ("terminate", "L0-n2"),
        ("replace", "L0"),
        ("replace", "L0-n1"),
        ("replace", "L0-n2"),
    ]
    assert "L0 lost L0-n1; its VMs are replaced as one" in actions[1].reason
    assert {a.placement for a in actions[3:]} == {A1}
    assert reconcile(gang(), [Observed(name=d.name, alive=True) for d in gang()], now=0.0) == []  # whole: left alone


def test_a_missing_vm_counts_as_lost_and_a_finished_learner_is_only_collected() -> None:
    observed = [Observed(name="L0", alive=True), Observed(name="L0-n1", alive=True)]
    assert kinds(reconcile(gang(), observed, now=0.0)) == [
        ("terminate", "L0"),
        ("terminate", "L0-n1"),
        ("replace", "L0"),
        ("replace", "L0-n1"),
        ("replace", "L0-n2"),
    ]
    done = [
        Observed(name="L0", alive=False, finished=True),
        Observed(name="L0-n1", alive=False),
        Observed(name="L0-n2", alive=True),
    ]
    assert kinds(reconcile(gang(), done, now=0.0)) == [("retire", "L0"), ("retire", "L0-n1")]  # n2 leaves by itself


def test_a_refusal_remembered_under_the_learner_moves_all_its_vms_or_holds_them_all() -> None:
    full = ProvisionError("no capacity", kind="capacity", scope="zone", provider="aws")
    memory = remember(Memory(), Action(kind="create", name="L0", reason="", placement=A1), full, now=0.0)
    actions = reconcile(gang(), [], now=1.0, memory=memory)
    assert {a.placement for a in actions} == {A2} and "a blocked, trying" in actions[0].reason
    slow = ProvisionError("throttled", kind="transient", scope="zone", provider="aws")
    memory = remember(Memory(), Action(kind="create", name="L0", reason="", placement=A1), slow, now=0.0)
    [held] = reconcile(gang(), [], now=0.5, memory=memory)
    assert held.kind == "wait" and held.name == "L0"  # one wait for the learner, not one start per VM
