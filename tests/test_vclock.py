from __future__ import annotations

import pytest

from ddctl_agents.core import vclock


def test_send_receive_orders_events() -> None:
    a = vclock.tick({}, "L0")
    s = vclock.receive({"syncer": 3}, a, "syncer")
    assert s == {"L0": 1, "syncer": 4}
    assert vclock.happened_before(a, s)
    assert not vclock.happened_before(s, a)


def test_independent_events_are_concurrent() -> None:
    a, b = vclock.tick({}, "L0"), vclock.tick({}, "L1")
    assert vclock.concurrent(a, b)
    assert not vclock.happened_before(a, a)


def test_merge_is_elementwise_max_and_pure() -> None:
    a = {"x": 1, "y": 5}
    assert vclock.merge(a, {"x": 3}) == {"x": 3, "y": 5}
    assert a == {"x": 1, "y": 5}


@pytest.mark.parametrize("bad", [[1, 2], {"": 1}, {"a": -1}, {"a": 1.5}, {"a": True}, {"a": 2**53}, {"a": 10**4000}])
def test_untrusted_clocks_are_validated(bad: object) -> None:
    with pytest.raises(ValueError, match="vector clock"):
        vclock.validate(bad)


def test_the_largest_count_a_json_reader_holds_exactly_is_taken() -> None:
    assert vclock.validate({"a": 2**53 - 1}) == {"a": 2**53 - 1}
