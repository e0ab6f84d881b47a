"""The job's goodput (the summary's, the status's, the dashboard's) from the seconds each learner says it trained.

It was steps x a recent median step time, which six runs of one job read anywhere from 0.65 to 1.0 (clipped): a
median of the last 16 steps says little about the first hundred. Now each heartbeat says how long the learner's
loop has trained this life (``train_s``) and the syncer counts what that rose by while it heard it.
"""

from __future__ import annotations

import pytest

from ddctl_agents.core.links import LearnerLinks
from ddctl_agents.errors import BadRequest
from ddctl_agents.service.ending import goodput
from ddctl_agents.service.requests import HeartbeatBody, parse_body
from ddctl_agents.service.roster import Roster, counted


def beat(roster: Roster, now: float, name: str, train_s: float | None) -> None:
    body = HeartbeatBody(learner=name, step=1, step_time=0.5, tokens=0, tokens_per_s=0.0, train_s=train_s)
    roster.heard(now, body, LearnerLinks())


def test_a_learner_that_joined_here_counts_all_it_trained_and_a_new_life_starts_again() -> None:
    roster = Roster()
    roster.joined(10.0, "L0", 1, "east", 0, LearnerLinks())
    assert counted(roster.info["L0"]) is None  # nothing said yet
    beat(roster, 12.0, "L0", 1.5)  # its loop began after the bootstrap: all of it trained here
    beat(roster, 14.0, "L0", 3.0)
    assert counted(roster.info["L0"]) == 3.0
    roster.joined(20.0, "L0", 2, "east", 8, LearnerLinks())  # replaced: the new life's loop starts at 0
    beat(roster, 22.0, "L0", 1.25)
    assert counted(roster.info["L0"]) == 4.25
    beat(roster, 23.0, "L0", 0.5)  # lower than it said: a life this process never saw register; all of it counts
    assert counted(roster.info["L0"]) == 4.75


def test_a_learner_recovered_from_the_log_counts_from_its_first_heartbeat_here() -> None:
    """Its first figure includes training before this process began, which this process's uptime does not cover."""
    roster = Roster()
    roster.recovered(100.0, "L1", 3)
    beat(roster, 101.0, "L1", 500.0)
    assert counted(roster.info["L1"]) == 0.0
    beat(roster, 103.0, "L1", 502.0)
    assert counted(roster.info["L1"]) == 2.0
    roster.joined(104.0, "L1", 3, "east", 0, LearnerLinks())  # registered again, the same life: it goes on counting
    beat(roster, 105.0, "L1", 503.0)
    assert counted(roster.info["L1"]) == 3.0


def test_no_learner_counts_more_than_the_time_since_it_joined_whatever_it_says() -> None:
    roster = Roster()
    roster.joined(0.0, "L2", 1, "east", 0, LearnerLinks())
    beat(roster, 5.0, "L2", 1e6)
    assert counted(roster.info["L2"]) == 5.0
    beat(roster, 9.0, "L2", 1e6 + 100.0)
    assert counted(roster.info["L2"]) == 9.0


REFUSED = [("-1.0", "train_s"), ("2e9", "train_s"), ('"3.0"', "train_s"), ("true", "train_s"),
           ("NaN", "field 'train_s': Input should be a finite number"), ("Infinity", "train_s")]  # fmt: skip


@pytest.mark.parametrize(("bad", "why"), REFUSED)
def test_a_train_s_that_is_not_seconds_is_refused_and_says_why(bad: str, why: str) -> None:
    raw = f'{{"learner": "L0", "step": 1, "step_time": 0.5, "tokens": 0, "tokens_per_s": 0.0, "train_s": {bad}}}'
    with pytest.raises(BadRequest, match=why):
        parse_body(HeartbeatBody, raw.encode())


def test_goodput_is_the_seconds_trained_over_learners_times_uptime() -> None:
    learners = [{"id": "L0", "step": 90, "step_time_s": 2.0, "train_s": 30.0},
                {"id": "L1", "step": 10, "step_time_s": 2.0, "train_s": 15.0}]  # fmt: skip
    assert goodput(learners, 50.0) == 0.45  # (30 + 15) / (2 x 50); the median estimate says 1.0 (200 / 100, clipped)
    learners[1]["train_s"] = None  # one that has not said yet counts nothing
    assert goodput(learners, 50.0) == 0.3


def test_without_any_learners_seconds_goodput_is_estimated_from_steps_as_before() -> None:
    learners = [{"id": "L0", "step": 20, "step_time_s": 1.0}, {"id": "L1", "step": 10, "step_time_s": 3.0, "train_s": None}]
    assert goodput(learners, 50.0) == 0.6  # 30 steps x the median 2.0 s / (2 x 50)
    assert goodput([], 50.0) is None and goodput(learners, 0.0) is None


def test_the_dashboard_shows_the_goodput_of_the_status_it_was_given() -> None:
    from ddctl.dashboard.snapshot import goodput as shown

    status = {"uptime_s": 40.0, "learners": [{"id": "L0", "step": 50, "step_time_s": 1.0, "train_s": 36.0},
                                             {"id": "L1", "step": 50, "step_time_s": 1.0, "train_s": 20.0}]}  # fmt: skip
    assert shown(status) == 0.7  # (36 + 20) / (2 x 40), not 100 steps x 1.0 s / 80 s (clipped to 1.0)


def test_a_figure_that_is_not_seconds_counts_as_unsaid_and_the_dashboard_still_draws() -> None:
    """The dashboard takes its status from another process: a broken one's figures must not turn goodput negative,
    past one, or into an exception."""
    from ddctl.dashboard.snapshot import goodput as shown

    learners = [{"id": "L0", "train_s": -50.0}, {"id": "L1", "train_s": "30"}, {"id": "L2", "train_s": float("nan")},
                {"id": "L3", "train_s": True}, {"id": "L4", "train_s": 30.0}]  # fmt: skip
    assert goodput(learners, 50.0) == 0.12  # 30 / (5 x 50)
    estimated = [{"id": "L0", "step": -100, "step_time_s": 1.0}, {"id": "L1", "step": 10, "step_time_s": -9.0}]
    assert goodput(estimated, 10.0) == 0.5  # 10 steps x the median of the one real step time / (2 x 10)
    assert shown({"uptime_s": "soon", "learners": learners}) is None and goodput(learners, float("inf")) is None
