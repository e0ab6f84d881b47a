"""The shard scheduler: site loads by hand, the min-max split against brute force, cadence, relays, assignment."""

from __future__ import annotations

import dataclasses
import itertools
import random
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ddctl_agents.core.schedule import CADENCES
from ddctl_agents.core.shardplan import PlanSettings, Traffic, choose_cadence, plan_shards
from ddctl_agents.core.siteload import Demand, Site, best_split, demand, loads

MBIT = 1e6 / 8


def site(name: str, learners: int, mbps: float, step_s: float = 1.0, candidate: bool = True) -> Site:
    rate = mbps * MBIT
    return Site(name=name, learners=learners, up_bytes_s=rate, down_bytes_s=rate, step_s=step_s, candidate=candidate)


def five_regions() -> list[Site]:
    """The issue's case: site links 1000/1000/1000/200/50 Mbit/s, learners 2/2/2/1/1."""
    return [site("a", 2, 1000), site("b", 2, 1000), site("c", 2, 1000), site("d", 1, 200), site("e", 1, 50)]


def model(fragments: int = 24, params: int = 150_000_000, inner_steps: int = 24) -> Traffic:
    per = params // fragments
    return Traffic(up=(int(per * 0.53),) * fragments, down=(2 * per,) * fragments, inner_steps=inner_steps)


def test_demand_counts_each_learner_up_and_one_pull_per_relayed_region() -> None:
    s = site("a", 3, 1000, step_s=0.5)
    plain = demand(s, up_bytes=100, down_bytes=400, inner_steps=10, cadence=1, relay=False)
    assert plain == Demand(up=3 * 100 / 5.0, down=3 * 400 / 5.0)  # period = 10 steps x 0.5 s
    relayed = demand(s, up_bytes=100, down_bytes=400, inner_steps=10, cadence=4, relay=True)
    assert relayed == Demand(up=3 * 100 / 20.0, down=400 / 20.0)


def test_a_measured_wait_for_versions_stretches_the_period_by_the_wait_less_one_step() -> None:
    """A learner sends k·H - 1 steps after it adopts: a 2 s wait at 0.5 s steps makes a 10-step period 11.5 s."""
    s = dataclasses.replace(site("a", 2, 1000, step_s=0.5), round_trip_s=2.0)
    assert demand(s, up_bytes=100, down_bytes=400, inner_steps=10, cadence=2, relay=False) == Demand(
        up=2 * 100 / 11.5, down=2 * 400 / 11.5
    )
    short = dataclasses.replace(s, round_trip_s=0.25)  # under one step: the learner never waits for it
    assert demand(short, 100, 400, 10, 1, False) == demand(site("a", 2, 1000, step_s=0.5), 100, 400, 10, 1, False)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="round_trip_s must be finite and >= 0"):
            dataclasses.replace(s, round_trip_s=bad)


def test_site_loads_by_hand_for_one_synchronizer() -> None:
    """All of the model at site a: a carries every other site's traffic, the others only their own."""
    sites = [site("a", 1, 100), site("b", 2, 100), site("c", 1, 10)]
    demands = [Demand(up=1.0, down=4.0), Demand(up=2.0, down=8.0), Demand(up=1.0, down=4.0)]
    got = loads(sites, demands, [1.0, 0.0, 0.0])
    assert (got[0].egress, got[0].ingress) == (8.0 + 4.0, 2.0 + 1.0)  # versions out to b and c; their uploads in
    assert (got[1].egress, got[1].ingress) == (2.0, 8.0)
    assert got[2].utilisation == pytest.approx(4.0 / (10 * MBIT))  # the busier way: its pulls over its downlink


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(10, 2000), st.floats(10, 2000), st.booleans()), min_size=2, max_size=3))
@example([(1, 10.0, 11.0, True), (4, 10.0, 18.0, True)])  # a pinned site at its interval's midpoint left the other over
def test_best_split_matches_a_brute_force_grid(spec: list[tuple[int, float, float, bool]]) -> None:
    sites = [
        Site(name=f"s{i}", learners=n, up_bytes_s=up * MBIT, down_bytes_s=down * MBIT, step_s=1.0, candidate=host)
        for i, (n, up, down, host) in enumerate(spec)
    ]
    hosts = [s.candidate for s in sites]
    if not any(hosts):
        hosts[0] = True
    demands = [demand(s, 5e6, 2e7, 10, 1, relay=False) for s in sites]
    split = best_split(sites, demands, hosts)
    assert sum(split.shares) == pytest.approx(1.0)
    assert all(x == 0 for x, h in zip(split.shares, hosts, strict=True) if not h)
    worst = max(x.utilisation for x in loads(sites, demands, split.shares))
    assert worst == pytest.approx(split.utilisation, rel=1e-6)
    grid = [i / 100 for i in range(101)]
    owners = [i for i, h in enumerate(hosts) if h]

    def spread(point: tuple[float, ...]) -> list[float]:
        shares = [0.0] * len(sites)
        for i, x in zip(owners, (*point, 1 - sum(point)), strict=True):
            shares[i] = x
        return shares

    brute = min(
        max(x.utilisation for x in loads(sites, demands, spread(point)))
        for point in itertools.product(grid, repeat=len(owners) - 1)
        if sum(point) <= 1 + 1e-9
    )
    assert split.utilisation <= brute + 1e-9  # no grid point does better than the bisection


def test_a_site_pinned_by_its_own_learners_leaves_the_others_balanced() -> None:
    """The 50 Mbit/s region is the worst site whatever the placement; the three fast ones still share evenly."""
    sites = five_regions()
    demands = [demand(s, 4e7, 1.5e8, 24, 1, relay=False) for s in sites]
    split = best_split(sites, demands, [True, True, True, False, False])
    fast = split.loads[:3]
    assert max(fast) == pytest.approx(min(fast), rel=1e-6)
    assert split.shares[:3] == pytest.approx((1 / 3,) * 3, rel=1e-6)
    assert split.utilisation == pytest.approx(split.loads[4])


def test_cadence_is_the_smallest_that_fits_the_target() -> None:
    traffic = model()
    slow, fast = site("e", 1, 50), site("a", 2, 1000)
    assert choose_cadence(fast, traffic, relay=True, target=0.8) == 1
    k = choose_cadence(slow, traffic, relay=False, target=0.8)
    own = [demand(slow, sum(traffic.up), sum(traffic.down), 24, c, relay=False).down / slow.down_bytes_s for c in CADENCES]
    assert own[CADENCES.index(k)] <= 0.8 < own[CADENCES.index(k) - 1]
    assert choose_cadence(site("x", 1, 0.01), traffic, relay=False, target=0.8) == CADENCES[-1]  # nothing fits


def test_plan_for_the_five_regions() -> None:
    plan = plan_shards(five_regions(), model())
    assert plan.relay == {"a": True, "b": True, "c": True, "d": False, "e": False}
    assert plan.cadence["a"] == 1 and plan.cadence["e"] > 1
    assert {s.site for s in plan.shards} == {"a", "b", "c"}  # the slow sites' own links are full: no shard there
    assert sorted(f for s in plan.shards for f in s.fragments) == list(range(24))
    assert all(plan.site_of(f) == s.site for s in plan.shards for f in s.fragments)
    assert [len(s.fragments) for s in plan.shards] == [8, 8, 8]
    assert [plan.owner[f] for f in range(3)] == [0, 1, 2]  # due order interleaves the shards
    assert plan.over_bound == pytest.approx(1.0)
    assert all(plan.floor[x.site] <= x.utilisation + 1e-12 for x in plan.loads)


def test_one_synchronizer_without_relays_or_cadence_overloads_the_slow_site() -> None:
    every_period = {s.name: 1 for s in five_regions()}
    plan = plan_shards(five_regions(), model(), PlanSettings(shards=1, relays=False, cadence=every_period))
    assert len(plan.shards) == 1 and plan.cadence == every_period
    assert plan.utilisation > 1  # the 50 Mbit/s link cannot carry one version per period
    tuned = plan_shards(five_regions(), model())
    assert tuned.utilisation <= 0.8 < plan.utilisation


def test_one_shard_goes_to_the_best_site_even_when_a_slower_one_is_listed_first() -> None:
    """Every placement ties on the slow region's own load (it cannot host); the choice goes by the next sites."""
    sites = [site("d", 1, 400), site("a", 2, 1000), site("e", 1, 50, candidate=False)]
    plan = plan_shards(sites, model(), PlanSettings(shards=1))
    assert [s.site for s in plan.shards] == ["a"]
    at_d = plan_shards([sites[0], dataclasses.replace(sites[1], candidate=False), sites[2]], model())
    busiest = {x.site: x.utilisation for x in plan.loads}
    assert max(busiest["a"], busiest["d"]) < max(x.utilisation for x in at_d.loads if x.site in ("a", "d"))


def test_fixed_shard_counts_and_non_candidates() -> None:
    sites = [site("a", 2, 1000), site("b", 1, 1000, candidate=False), site("c", 1, 100)]
    plan = plan_shards(sites, model(fragments=6), PlanSettings(shards=5))
    assert "b" not in {s.site for s in plan.shards}
    assert len(plan.shards) == 5 and all(s.fragments for s in plan.shards)
    assert [s.index for s in plan.shards] == list(range(5))
    with pytest.raises(ValueError, match="shards must be 1..6"):
        plan_shards(sites, model(fragments=6), PlanSettings(shards=7))
    with pytest.raises(ValueError, match="no site may host"):
        plan_shards([site("a", 1, 10, candidate=False)], model())


def test_whole_fragments_stay_close_to_the_bound_and_planning_is_fast_and_deterministic() -> None:
    rng = random.Random(7)
    sites = [
        Site(
            name=f"s{i}",
            learners=rng.randint(1, 4),
            up_bytes_s=rng.uniform(50, 2000) * MBIT,
            down_bytes_s=rng.uniform(50, 2000) * MBIT,
            step_s=rng.uniform(0.5, 2.0),
        )
        for i in range(16)
    ]
    sizes = [rng.randint(1, 10) * 1_000_000 for _ in range(256)]
    traffic = Traffic(up=tuple(int(x * 0.53) for x in sizes), down=tuple(2 * x for x in sizes), inner_steps=24)
    started = time.perf_counter()
    plan = plan_shards(sites, traffic)
    elapsed = time.perf_counter() - started
    assert 1.0 <= plan.over_bound < 1.05
    assert elapsed < 10, elapsed
    assert plan_shards(sites, traffic) == plan


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="link rates and step time"):
        Site(name="x", learners=1, up_bytes_s=0.0, down_bytes_s=1.0, step_s=1.0)
    with pytest.raises(ValueError, match="one positive upload"):
        Traffic(up=(1, 2), down=(1,), inner_steps=4)
    with pytest.raises(ValueError, match="at least one site must host"):
        best_split([site("a", 1, 10)], [Demand(up=1, down=1)], [False])


def test_a_relay_runs_at_cadence_one_only_and_a_slower_cadence_is_chosen_without_one() -> None:
    traffic = model()
    # four learners on a link their versions overload even relayed: it sends less often, and then has no relay
    # (a relay forwards every version; at cadence k a learner is sent only the 1/k it adopts)
    crowded = site("x", 4, 120)
    k = choose_cadence(crowded, traffic, relay=True, target=0.8)
    unrelayed = [demand(crowded, sum(traffic.up), sum(traffic.down), 24, c, relay=False) for c in CADENCES]
    assert k > 1 and max(unrelayed[CADENCES.index(k)].up, unrelayed[CADENCES.index(k)].down) / crowded.down_bytes_s <= 0.8
    plan = plan_shards([site("a", 2, 1000), crowded], traffic)
    assert plan.cadence == {"a": 1, "x": k} and plan.relay == {"a": True, "x": False}
    # a user-fixed cadence above one has no relay either
    fixed = plan_shards([site("a", 2, 1000), site("b", 2, 1000)], traffic, PlanSettings(cadence={"b": 2}))
    assert fixed.relay == {"a": True, "b": False}
    # where the relay lets cadence 1 fit, the region keeps it and its relay
    relieved = site("y", 4, 400)
    assert demand(relieved, sum(traffic.up), sum(traffic.down), 24, 1, relay=False).down / relieved.down_bytes_s > 0.8
    assert choose_cadence(relieved, traffic, relay=True, target=0.8) == 1
