"""Re-planning: a halved link moves fragments once, after confirmations and dwell; noise moves nothing."""

from __future__ import annotations

import dataclasses
import random

import pytest

from ddctl_agents.core.replan import Replanner, ReplanSettings
from ddctl_agents.core.shardplan import PlanSettings, placement_loads, placement_utilisation, plan_shards
from ddctl_agents.core.siteload import Site
from tests.test_shardplan import five_regions, model


def halved(name: str) -> list[Site]:
    return [
        dataclasses.replace(s, up_bytes_s=s.up_bytes_s / 2, down_bytes_s=s.down_bytes_s / 2) if s.name == name else s
        for s in five_regions()
    ]


def start() -> list[str]:
    plan = plan_shards(five_regions(), model())
    return [plan.site_of(f) for f in range(24)]


def test_a_halved_link_causes_one_replan_after_three_confirmations() -> None:
    planner, owned, replans = Replanner(ReplanSettings(dwell_s=0)), start(), []
    for t in range(0, 600, 30):
        if (replan := planner.consider(t, halved("a"), model(), owned, PlanSettings())) is not None:
            replans.append((t, replan))
            for move in replan.moves:
                assert owned[move.fragment] == move.source
                owned[move.fragment] = move.target
    assert [t for t, _ in replans] == [60]  # the third consideration
    replan = replans[0][1]
    assert 1 <= len(replan.moves) <= 4 and all(m.source == "a" for m in replan.moves)
    assert replan.after < replan.before * 0.8
    plan = plan_shards(halved("a"), model())  # the predicted figure is what the new assignment really loads
    found = placement_loads(halved("a"), model(), plan.cadence, plan.relay, owned)
    assert placement_utilisation(found, plan.floor) == pytest.approx(replan.after)
    assert "seen 3 times" in replan.cause


def test_dwell_holds_a_confirmed_move_back() -> None:
    planner = Replanner(ReplanSettings(dwell_s=100), last_move=0.0)
    owned = start()
    answers = [planner.consider(t, halved("a"), model(), owned, PlanSettings()) for t in (10, 20, 30, 40, 100)]
    assert answers[:4] == [None] * 4 and answers[4] is not None


def test_noise_of_twenty_percent_causes_no_replan() -> None:
    rng, planner, owned = random.Random(0), Replanner(ReplanSettings(dwell_s=0)), start()
    for t in range(300):
        noisy = [
            dataclasses.replace(
                s, up_bytes_s=s.up_bytes_s * rng.uniform(0.8, 1.2), down_bytes_s=s.down_bytes_s * rng.uniform(0.8, 1.2)
            )
            for s in five_regions()
        ]
        assert planner.consider(float(t), noisy, model(), owned, PlanSettings()) is None


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="0 < gain < 1"):
        ReplanSettings(gain=1.5)
