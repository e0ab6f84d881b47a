from __future__ import annotations

import pytest

from ddctl_agents.core.quorum import QuorumConfig, RoundView, Timing, decide_round, grace_window
from ddctl_agents.errors import ConfigError

LIVE = frozenset({"A", "B", "C"})


def view(arrived: set[str], opened_at: float = 0.0, quorum_met_at: float | None = None) -> RoundView:
    return RoundView(opened_at=opened_at, arrived=frozenset(arrived), live=LIVE, quorum_met_at=quorum_met_at)


def test_waits_for_the_quorum_and_says_how_far_it_is() -> None:
    d = decide_round(1.0, view({"A"}), Timing(step_time=1.0), QuorumConfig(quorum=2))
    assert not d.close and d.reason == "waiting for quorum 1/2" and d.wake_at is None


def test_closes_when_everyone_live_has_arrived() -> None:
    d = decide_round(1.0, view({"A", "B", "C"}), Timing(step_time=1.0), QuorumConfig(quorum=1))
    assert d.close and d.reason == "all 3 live learners arrived"


def test_without_grace_closes_at_the_quorum() -> None:
    d = decide_round(1.0, view({"A"}), Timing(step_time=1.0, forecasts={"B": 1.1}), QuorumConfig(quorum=1, grace=False))
    assert d.close and "grace off" in d.reason


def test_grace_waits_for_a_learner_predicted_inside_the_window() -> None:
    cfg = QuorumConfig(quorum=1, overlap=2, gamma=0.5, cap_steps=1.0)
    timing = Timing(step_time=1.0, sync_time=0.2, forecasts={"B": 10.4, "C": 30.0})
    d = decide_round(10.0, view({"A"}, opened_at=10.0), timing, cfg)
    # slack = 2*1 - (0 + 0.2) = 1.8; window = min(0.5*1.8, 1.0) = 0.9
    assert not d.close
    assert d.grace_s == pytest.approx(0.9)
    assert d.wake_at == pytest.approx(10.9)
    assert "waiting up to 0.900s for B" in d.reason


def test_grace_closes_at_once_when_no_one_can_make_it() -> None:
    cfg = QuorumConfig(quorum=1, gamma=0.5)
    timing = Timing(step_time=1.0, forecasts={"B": 12.0, "C": 30.0})
    d = decide_round(10.0, view({"A"}, opened_at=10.0), timing, cfg)
    assert d.close and "no absent learner can arrive within grace" in d.reason


def test_grace_closes_when_the_window_is_over() -> None:
    cfg = QuorumConfig(quorum=1, gamma=0.5)
    timing = Timing(step_time=1.0, forecasts={"B": 10.5})
    d = decide_round(11.0, view({"A"}, opened_at=10.0, quorum_met_at=10.0), timing, cfg)
    assert d.close and d.reason.startswith("grace 1.000s over")


def test_time_spent_reaching_quorum_eats_into_the_slack() -> None:
    cfg = QuorumConfig(quorum=1, overlap=2, gamma=1.0, cap_steps=10.0)
    assert grace_window(0.0, Timing(step_time=1.0), cfg) == pytest.approx(2.0)
    assert grace_window(1.5, Timing(step_time=1.0), cfg) == pytest.approx(0.5)
    assert grace_window(3.0, Timing(step_time=1.0), cfg) == 0.0  # never negative
    assert grace_window(0.0, Timing(step_time=1.0), QuorumConfig(cap_steps=0.25)) == pytest.approx(0.25)


def test_quorum_is_lowered_to_the_live_learners_so_a_round_never_hangs() -> None:
    small = RoundView(opened_at=0.0, arrived=frozenset({"A"}), live=frozenset({"A"}))
    d = decide_round(1.0, small, Timing(step_time=1.0), QuorumConfig(quorum=3))
    assert d.close and "quorum lowered" in d.reason


@pytest.mark.parametrize("kwargs", [{"quorum": 0}, {"overlap": -1}, {"gamma": 0.0}, {"gamma": 1.5}, {"cap_steps": -1.0}])
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="must be"):
        QuorumConfig(**kwargs)  # type: ignore[arg-type]


def test_by_default_only_the_slack_bounds_the_window() -> None:
    # gamma * tau steps = 1.6 step times: a one-step cap cut off equal-speed learners arriving 1-1.3 steps apart
    assert grace_window(0.0, Timing(step_time=1.0), QuorumConfig()) == pytest.approx(1.6)
    assert grace_window(0.0, Timing(step_time=1.0), QuorumConfig(overlap=4)) == pytest.approx(3.2)
    assert grace_window(0.0, Timing(step_time=1.0), QuorumConfig(cap_steps=1.0)) == pytest.approx(1.0)


def test_a_learner_without_a_forecast_is_waited_for_until_the_window_ends() -> None:
    cfg = QuorumConfig(quorum=1)
    timing = Timing(step_time=1.0, forecasts={"C": 30.0})  # B has no forecast yet: nothing measured about it
    d = decide_round(10.0, view({"A"}, opened_at=10.0), timing, cfg)
    assert not d.close and d.cause == "grace_wait" and d.wake_at == pytest.approx(11.6)
    assert "waiting up to 1.600s for B (no forecast yet)" in d.reason
    later = decide_round(11.6, view({"A"}, opened_at=10.0, quorum_met_at=10.0), timing, cfg)
    assert later.close and later.cause == "grace_over"
