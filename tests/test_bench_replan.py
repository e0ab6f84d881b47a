"""``ddctl bench replan``: its hub case, the link changes of its scenarios, and a halved link re-planned once."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from ddctl.bench import wan_replan
from ddctl.bench.report import replan_table
from ddctl.bench.wan_layouts import WanCase, layouts
from ddctl.bench.wan_replan import HUB_REGIONS, Saboteur, changes, hub_case, hub_layout, measure_replan
from ddctl.config.synchronizer import traffic
from ddctl.errors import DdctlError
from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.core.replan import Replanner, ReplanSettings
from ddctl_agents.core.shardplan import PlanSettings
from ddctl_agents.core.siteload import Site
from ddctl_agents.waiting import wait_until
from tests.test_bench_wan import NEEDS_ROOT


def test_the_hub_case_splits_the_fragments_between_the_two_hubs() -> None:
    case = hub_case()
    layout = hub_layout(case)
    assert layout.shard_sites == ("h1", "h2") and sorted(layout.owner.count(i) for i in (0, 1)) == [3, 3]
    assert case.learners == {"a": 2, "b": 2, "c": 1, "h1": 0, "h2": 0} and layout.in_flight == 1
    n, rr, p2 = layouts(WanCase(regions=HUB_REGIONS), ["N", "N-rr", "P2"])  # bench wan's layouts: synchronizers at hubs
    assert n.shard_sites == p2.shard_sites == ("h1",) and rr.shard_sites == ("h1", "h2")
    assert layout.cadence["c"] > 1 == layout.cadence["a"]  # the slow region sends less often
    flow = traffic(case.job())
    assert min(flow.up) >= 64 * 1024 and min(flow.down) >= 64 * 1024  # both directions large enough to be measured


def gain_from_halving(case: WanCase, site_of: list[str], halved: str, cadence: dict[str, int]) -> float:
    hosts = set(site_of)
    sites: list[Site] = [
        dataclasses.replace(s, candidate=s.name in hosts, up_bytes_s=s.up_bytes_s / (2 if s.name == halved else 1),
                            down_bytes_s=s.down_bytes_s / (2 if s.name == halved else 1))
        for s in case.sites()
    ]  # fmt: skip
    planner = Replanner(ReplanSettings(confirmations=1, dwell_s=0))
    planner.consider(0.0, sites, traffic(case.job()), site_of, PlanSettings(shards=len(hosts), relays=False, cadence=cadence))
    return 1 - planner.best / planner.current


def test_why_hubs_halving_a_shard_site_that_its_own_learners_fill_calls_for_no_move() -> None:
    """In the five-region case every shard site's link is mostly its own two learners' traffic: no placement relieves
    it. A hub carries only other regions' traffic, so halving it calls for moving half its share."""
    five = WanCase(preset="tiny", fast_mbit=60.0, inner_steps=16, seconds=120.0)
    w = layouts(five, ["W"])[0]
    assert gain_from_halving(five, [w.shard_sites[o] for o in w.owner], "a", w.cadence) < 0.2
    hub = hub_case()
    made = hub_layout(hub)
    assert gain_from_halving(hub, [made.shard_sites[o] for o in made.owner], "h1", made.cadence) > 0.3


def test_the_scenarios_change_the_links_as_they_say() -> None:
    case = hub_case(seconds=90)
    assert changes("halve", case, 5.0) == changes("kill", case, 5.0) == [(30.0, {"h1": (30.0, 30.0)})]
    noise = changes("noise", case, 5.0, seed=3)
    assert [t for t, _ in noise] == [5.0 * i for i in range(1, 18)] and noise == changes("noise", case, 5.0, seed=3)
    factors = [new / case.links[r][k] for _, rates in noise for r, pair in rates.items() for k, new in enumerate(pair)]
    assert 0.8 <= min(factors) < 0.85 and 1.15 < max(factors) <= 1.2 and len(factors) == 17 * 5 * 2
    assert noise != changes("noise", case, 5.0, seed=4)


def test_bad_scenarios_and_cases_are_refused_before_any_namespace_is_made() -> None:
    with pytest.raises(DdctlError, match="scenarios must be some of halve, noise, kill, got 'drop'"):
        measure_replan(hub_case(), ["halve", "drop"])
    with pytest.raises(DdctlError, match="give at least one scenario"):
        measure_replan(hub_case(), [])
    with pytest.raises(DdctlError, match="distinct alphanumeric names"):
        WanCase(regions=(("a", 1.0, 1), ("a", 1.0, 1)))
    with pytest.raises(DdctlError, match="at least one region needs learners"):
        WanCase(regions=(("h", 1.0, 0),))
    with pytest.raises(DdctlError, match="link share must be in"):
        WanCase(regions=(("a", 0.0, 1),))


def test_the_replan_table_shows_each_scenarios_figures() -> None:
    row = {"scenario": "halve", "changes": [{"t": 40.0}], "looks": 59, "efficiency": 0.8123, "balanced": True,
           "peak_gain_seen": 0.3456,
           "replans": [{"t": 47.2, "moves": [{"fragment": 4, "from": "h1", "to": "h2"}]}]}  # fmt: skip
    result = {"case": {"seconds": 120}, "replan": {"gain": 0.2, "confirmations": 3, "dwell_s": 30},
              "plan": {"shards": ["h1", "h2"]}, "rows": [row]}  # fmt: skip
    console = Console(width=200, record=True)
    console.print(replan_table(result))
    text = console.export_text()
    assert "47s: 4 h1->h2" in text and "35%" in text and "0.812" in text and "seen 3 times, 30 s apart" in text


@NEEDS_ROOT
@pytest.mark.slow
def test_a_halved_hub_link_is_replanned_toward_the_other_hub_without_flapping_over_the_emulated_wan() -> None:
    """h1 is halved at 16 s; the re-plan follows within a few looks, and the 10 s dwell leaves the rest of the run
    free for a second one. On an idle machine none comes (the move reached what the measurements call for). Under a
    CI run's load the loaded h1 reads slower than its link (the known bias), and the damped move can take one more
    confirmed re-plan, past the dwell, to finish (CI at 04fdb6f: 222% -> 148%, then 169% -> 128%, one fragment each),
    or two (CI at 3c2fd4c: three re-plans, the first 238% -> 159% predicted). A CI run at ce011aa then made a
    later move past the dwell that was not h1 -> h2 (with two hubs, a move back), and one at 90f53a5 failed here
    too (its output lost): a move back now waits three dwell times (``core/replan.RETURN_DWELLS``). What must hold
    either way: every move follows the halving, h1 -> h2; none goes back (no flapping); each re-plan gains and waits
    out the dwell after the one before; at most two continuations (the 48-s run has room for no more than three
    re-plans past the dwell). A second run is taken when the first breaks a rule (the CI of f910f24 failed once
    more with the bar), and it must hold them all: one failed run says the machine's load, two say the code."""
    first = _halved_hub_run()
    if first is None:
        return
    second = _halved_hub_run()  # one more run: the emulated WAN's timing moves with the machine's load
    assert second is None, f"two runs in a row failed: {first} / then: {second}"


def _halved_hub_run() -> str | None:
    """One run of the halved-hub scenario: None if every rule above holds, else which one did not and every re-plan."""
    result = measure_replan(hub_case(seconds=48), ["halve"], settings=ReplanSettings(dwell_s=10), every_s=1.0)
    row = result["rows"][0]
    replans = row["replans"]
    moves = [m for r in replans for m in r["moves"]]
    moved = {m["fragment"] for m in moves}
    last = row["measured_last"]
    rules = {
        "one change, h1 halved": len(row["changes"]) == 1 and row["changes"][0]["mbit"] == {"h1": [30.0, 30.0]},
        "one to three re-plans": 1 <= len(replans) <= 3,
        "after the halving, each a gain": bool(replans)
        and row["changes"][0]["t"] < replans[0]["t"]
        and all(r["after"] < r["before"] * 0.8 for r in replans),
        "room for three more looks past the dwell": bool(replans) and replans[0]["t"] + 10 + 3 < row["last_look_t"],
        "each continuation waits out the dwell": all(later["t"] >= replans[0]["t"] + 10 for later in replans[1:]),
        "the first re-plan moves, every move h1 -> h2": bool(replans)
        and bool(replans[0]["moves"])
        and all((m["from"], m["to"], m["shard"]) == ("h1", "h2", "S1") for m in moves),
        "the moved fragments end at h2": row["owned_at_end"][1] == sorted(set(row["owned_at_end"][1]) | moved)
        and not moved & set(row["owned_at_end"][0]),
        "books balanced, no failed look": row["balanced"] and row["ledger"]["pending"] == 0 and not row["failed_looks"],
        "h1's uplink read the slower": last["h1"]["up_mbps"] < last["h2"]["up_mbps"],
    }
    broken = [rule for rule, held in rules.items() if not held]
    return f"{broken}: re-plans {replans}, measured {last}" if broken else None


class StubShard:
    """What the saboteur touches of a shard: its address, directories, kill and start."""

    def __init__(self, root: Path, i: int, fail: bool = False) -> None:
        self.url, self.root, self.job_dir, self.fail = f"https://10.0.0.{i}:443", root / f"S{i}", root / "S0" / "job", fail
        self.killed, self.started = 0, []

    def kill(self) -> None:
        self.killed += 1

    def start(self, *flags: str) -> None:
        if self.fail:
            raise RuntimeError("port taken")
        self.started.append(flags)

    def connector(self, kind: type[SyncerClient]) -> Callable[[str], SyncerClient]:
        return lambda url: kind(url, "token", None)


def test_the_saboteur_kills_the_hand_in_target_once_and_starts_it_again_on_its_own_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wan_replan, "DOWN_S", 0.01)
    shards = [StubShard(tmp_path, 0), StubShard(tmp_path, 1)]
    handed: list[str] = []
    monkeypatch.setattr(SyncerClient, "hand_in", lambda self, data: handed.append(self.url) or {"ok": True})
    quiet = Saboteur(shards, ("h1", "h2"), armed=False)  # type: ignore[arg-type]
    assert quiet.connect(shards[1].url).hand_in(b"x") == {"ok": True} and quiet.fired == [] and shards[1].killed == 0

    saboteur = Saboteur(shards, ("h1", "h2"), armed=True)  # type: ignore[arg-type]
    client = saboteur.connect(shards[1].url)
    client.hand_in(b"x")
    client.hand_in(b"y")  # a second hand-in is not struck again
    assert [s.killed for s in shards] == [0, 1] and handed == [shards[1].url] * 3
    wait_until(lambda: "restarted_after_s" in saboteur.fired[0], timeout_s=5, what="the restart")
    (flags,) = shards[1].started
    assert flags[flags.index("--shard") + 1] == "S1" and flags[flags.index("--state-dir") + 1] == str(tmp_path / "S1" / "state")
    assert flags[flags.index("--site") + 1] == "h2"

    broken = [StubShard(tmp_path, 0), StubShard(tmp_path, 1, fail=True)]
    failing = Saboteur(broken, ("h1", "h2"), armed=True)  # type: ignore[arg-type]
    failing.strike(broken[1].url)
    wait_until(lambda: "restart_error" in failing.fired[0], timeout_s=5, what="the failed restart")
    assert failing.fired[0]["shard"] == "S1" and "port taken" in failing.fired[0]["restart_error"]
