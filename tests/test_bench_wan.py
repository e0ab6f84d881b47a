"""``ddctl bench wan``: the layouts it compares, the emulated WAN it runs them over, and its figures."""

from __future__ import annotations

import math
import os
import re
import subprocess
import time

import pytest
from typer.testing import CliRunner

from ddctl.bench.wan_layouts import FIVE_REGIONS, LAYOUTS, Layout, WanCase, at_pace, layout_job, layouts, predict, with_hubs
from ddctl.bench.wannet import wan
from ddctl.cli.app import app
from ddctl.config.synchronizer import CPU_FLOPS_PRIOR, traffic
from ddctl.errors import DdctlError
from ddctl.providers.linkshape import available
from ddctl_agents.train import flops, presets
from ddctl_agents.train.config import InnerConfig

NEEDS_ROOT = pytest.mark.skipif(available() is not None, reason=f"{available()}")


@pytest.fixture(scope="module")
def made() -> dict[str, Layout]:
    return {layout.name: layout for layout in layouts(WanCase())}


def test_the_four_layouts_are_what_their_names_say(made: dict[str, Layout]) -> None:
    n, rr, p2, w = (made[name] for name in LAYOUTS)
    case = WanCase()
    assert n.shard_sites == ("a",) and set(n.owner) == {0} and set(n.cadence.values()) == {1} and n.in_flight == 3
    assert rr.shard_sites == ("a", "b", "c") and rr.owner == tuple(p % 3 for p in range(case.fragments))
    assert set(rr.cadence.values()) == {1} and rr.in_flight == 3
    assert p2.shard_sites == ("a",) and p2.in_flight is None  # auto: the learner's pacing
    assert p2.cadence["d"] > 1 and p2.cadence["e"] > 1 and p2.cadence["a"] == 1
    assert len(w.shard_sites) > 1 and set(w.shard_sites) <= {"a", "b", "c"} and w.in_flight is None
    assert w.cadence == p2.cadence
    # a relay in each region with two learners at cadence 1; none where one learner, or past cadence 1, or in N
    assert [r for r, on in w.relay.items() if on] == [r for r, on in p2.relay.items() if on] == ["a", "b", "c"]
    assert not any(n.relay.values()) and not any(rr.relay.values())
    worst = {name: made[name].predicted for name in LAYOUTS}
    assert worst["W"] <= worst["P2"] < worst["N"]  # with relays both are bound by region e's own link
    site_a = {name: next(x.utilisation for x in made[name].loads if x.site == "a") for name in LAYOUTS}
    assert site_a["W"] < 0.5 * site_a["P2"] and site_a["P2"] < 0.5 * site_a["N"]  # relays halve a's fan-out, shards again


def test_w_direct_is_the_full_scheduler_planned_without_relays(made: dict[str, Layout]) -> None:
    [direct] = layouts(WanCase(), ["W-direct"])
    w = made["W"]
    assert not any(direct.relay.values()) and len(direct.shard_sites) > 1 and direct.in_flight is None
    # every version crosses into a fast region once per learner without them: the busiest site's load only grows
    assert direct.predicted >= w.predicted
    site_a = {x.site: x.utilisation for x in direct.loads}["a"]
    assert site_a > next(x.utilisation for x in w.loads if x.site == "a")
    assert "W" in LAYOUTS and "W-direct" not in LAYOUTS  # run only when asked for


def test_with_hubs_the_synchronizers_run_at_the_hubs_and_only_shards_keep_one_sites_link_under_the_target() -> None:
    """Three synchronizer-only hubs at half the fast sites' link: one synchronizer's site carries every region's
    traffic and cannot (the case where sharding pays); the scheduler's shards split it three ways."""
    case = WanCase(regions=with_hubs(0.5))
    assert case.regions == (*FIVE_REGIONS, ("h1", 0.5, 0), ("h2", 0.5, 0), ("h3", 0.5, 0)) and case.hosts == ("h1", "h2", "h3")
    assert WanCase().hosts == ("a", "b", "c", "d", "e")
    n, rr, p2, w = layouts(case, LAYOUTS)
    assert n.shard_sites == p2.shard_sites == ("h1",) and rr.shard_sites == ("h1", "h2", "h3")
    assert rr.owner == tuple(p % 3 for p in range(case.fragments)) and set(n.cadence.values()) == {1}
    assert sorted(w.shard_sites) == ["h1", "h2", "h3"] and sorted(w.owner.count(i) for i in range(3)) == [2, 2, 2]
    assert w.cadence == p2.cadence and w.relay == p2.relay and [r for r, on in w.relay.items() if on] == ["a", "b", "c"]
    hub = {layout.name: {x.site: x.utilisation for x in layout.loads} for layout in (n, p2, w)}
    assert hub["P2"]["h1"] > 2.0 and hub["N"]["h1"] > hub["P2"]["h1"]  # one site carries it all: overloaded
    assert all(0.7 < hub["W"][h] <= 0.81 for h in ("h1", "h2", "h3"))  # a third each, within the plan's target
    assert hub["W"]["h1"] == pytest.approx(hub["P2"]["h1"] / 3, rel=1e-3)
    assert all(hub["W"][r] == hub["P2"][r] for r in "abcde")  # a learner's own link does not change with the shards
    allowed = "a hub's link must be a share in [0.05, 1] of the fast sites', "
    for share, got in ((0.0, "got 0.0"), (1.5, "got 1.5"), (math.nan, "got nan")):
        with pytest.raises(DdctlError, match=re.escape(allowed + got)):
            with_hubs(share)
    done = CliRunner().invoke(app, ["bench", "wan", "--hubs", "2", "--json"])
    assert done.exit_code == 2 and "a hub's link must be a share in [0.05, 1] of the fast sites', got 2.0" in done.output


def test_learners_are_named_region_by_region() -> None:
    regions = WanCase().learner_regions
    assert regions == {"L0": "a", "L1": "a", "L2": "b", "L3": "b", "L4": "c", "L5": "c", "L6": "d", "L7": "e"}


def test_a_layout_may_name_its_uploads_in_flight() -> None:
    w1, w = layouts(WanCase(), ["W/1", "W"])
    assert (w1.name, w1.in_flight, w.in_flight) == ("W/1", 1, None)
    assert (w1.shard_sites, w1.owner, w1.cadence, w1.loads) == (w.shard_sites, w.owner, w.cadence, w.loads)
    assert layouts(WanCase(), ["N/auto"])[0].in_flight is None
    with pytest.raises(DdctlError, match=r"layout W/0: uploads in flight takes 'auto' or a whole number in \[1, 64\], got '0'"):
        layouts(WanCase(), ["W/0"])
    with pytest.raises(DdctlError, match=r"/auto or /N, uploads in flight\), got \['X/1'\]"):
        layouts(WanCase(), ["X/1"])


def test_a_layout_may_set_every_regions_cadence() -> None:
    w, w1, w1_flight, direct8 = layouts(WanCase(), ["W", "W@1", "W@1/1", "W-direct@8"])
    assert set(w.cadence.values()) != {1}  # the plan slows the slow regions down, so @1 changes something
    assert w1.cadence == dict.fromkeys(w.cadence, 1) and (w1_flight.cadence, w1_flight.in_flight) == (w1.cadence, 1)
    assert (w1.shard_sites, w1.owner, w1.relay) == (w.shard_sites, w.owner, w.relay)
    slowed = [r for r, k in w.cadence.items() if k > 1]
    for got, planned in zip(w1.loads, w.loads, strict=True):  # predicted for what runs: the slowed regions send more
        assert got.site == planned.site
        if got.site in slowed:
            assert got.utilisation > planned.utilisation
    assert direct8.cadence == dict.fromkeys(w.cadence, 8) and not any(direct8.relay.values())
    with pytest.raises(DdctlError, match=r"layout W@3: @K sets every region's cadence, K one of 1, 2, 4, 8, got '3'"):
        layouts(WanCase(), ["W@3"])
    with pytest.raises(DdctlError, match=r"layout W@2: regions a, b, c pull through a relay, which serves every version"):
        layouts(WanCase(), ["W@2"])
    done = CliRunner().invoke(app, ["bench", "wan", "--layouts", "N,W@0", "--json"])  # before any namespace is made
    assert done.exit_code == 2 and "layout W@0: @K sets every region's cadence, K one of 1, 2, 4, 8, got '0'" in done.output


def test_a_layout_may_weigh_late_updates_as_one_period_or_by_their_staleness() -> None:
    """``+period`` or ``+staleness`` changes only how the layout's synchronizers weigh a late update (staleness, the
    job's default, without either): the job they are given says so, and the plan, its cadences and predictions are the
    layout's without it."""
    case = WanCase()
    w, stale, every1 = layouts(case, ["W+period", "W", "W@1+staleness/1"])
    assert (w.late_weight, stale.late_weight, every1.late_weight) == ("period", "staleness", "staleness")
    assert (stale.shard_sites, stale.owner, stale.cadence, stale.relay, stale.loads) == (
        w.shard_sites, w.owner, w.cadence, w.relay, w.loads)  # fmt: skip
    assert every1.cadence == dict.fromkeys(w.cadence, 1) and every1.in_flight == 1
    assert layout_job(case, w).syncer.late_weight == "period" and layout_job(case, stale).syncer == case.job().syncer
    assert layout_job(case, stale).syncer.max_behind == case.max_behind  # the rest of the job as the case has it
    with pytest.raises(DdctlError, match=r"layout W\+newest: \+WEIGHT says how late updates are weighed, WEIGHT one of period, "
                                         r"staleness, got 'newest'"):  # fmt: skip
        layouts(case, ["W+newest"])
    with pytest.raises(DdctlError, match=r"layouts must be some of .*\+period/\+staleness, how late updates are weighed"):
        layouts(case, ["X+staleness"])
    done = CliRunner().invoke(app, ["bench", "wan", "--layouts", "N,W+", "--json"])  # before any namespace is made
    assert done.exit_code == 2 and "layout W+: +WEIGHT says how late updates are weighed" in done.output


def test_the_prediction_of_one_synchronizer_is_every_other_learners_traffic_through_its_site(made: dict[str, Layout]) -> None:
    case = WanCase()
    flow = traffic(case.job())
    period = case.inner_steps * case.step_s
    a = next(x for x in made["N"].loads if x.site == "a")
    others = sum(n for region, n in case.learners.items() if region != "a")
    assert a.egress == pytest.approx(others * sum(flow.down) / period)
    assert a.ingress == pytest.approx(others * sum(flow.up) / period)
    assert a.utilisation == pytest.approx(a.egress / (case.fast_mbit * 1e6 / 8))
    e = next(x for x in made["N"].loads if x.site == "e")
    assert e.ingress == pytest.approx(sum(flow.down) / period)  # its one learner's versions, all from a


def test_a_slower_pace_predicts_proportionally_lighter_links(made: dict[str, Layout]) -> None:
    case, layout = WanCase(), made["W"]
    flow = traffic(case.job())
    slow = predict(layout, at_pace(case.sites(), dict.fromkeys(case.learners, 2 * case.step_s)), flow)
    for fast, half in zip(layout.loads, slow, strict=True):
        assert half.utilisation == pytest.approx(fast.utilisation / 2)


BAD = [
    ({"fast_mbit": 0.0}, "fast_mbit must be in [0.1, 1000] Mbit/s, got 0.0"),
    ({"step_s": math.nan}, "step_s must be in [0.01, 60] seconds, got nan"),
    ({"seconds": 1.0}, "seconds must be in [8, 3600] (10 periods at least), got 1.0"),
    ({"seconds": math.inf}, "seconds must be in [8, 3600]"),
    ({"fragments": 2}, "fragments must be in [3, 64]"),
    ({"train_tokens": 99_999}, "train_tokens must be 0 (synthetic steps) or in [100000, 100000000], got 99999"),
    ({"max_behind": -1}, "max_behind must be in 0..8 rounds, got -1"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_a_bad_case_is_refused_with_what_is_allowed(change: dict[str, float], message: str) -> None:
    with pytest.raises(DdctlError, match=re.escape(message)):
        WanCase(**change)  # type: ignore[arg-type]  # a float for each field named


def test_a_trained_case_takes_its_steps_from_the_token_budget_and_evaluates_on_the_full_corpus() -> None:
    synthetic, trained = WanCase(preset="tiny"), WanCase(preset="tiny", train_tokens=1_000_000)
    assert synthetic.steps == 600 and synthetic.job().data.eval_windows == 8  # seconds / step
    assert synthetic.job().syncer.max_behind == 1 and WanCase(max_behind=0).job().syncer.max_behind == 0
    assert trained.steps == 1_000_000 // (8 * 128 * 8) == 122  # tokens over 8 learners' batches of 8 x 128 bytes
    job = trained.job()
    assert job.budget.tokens == 122 * 8 * 128 * 8 and job.data.eval_windows == 64 and job.data.max_bytes == 24 * 2**20


def test_a_trained_case_is_planned_at_the_models_step_not_the_synthetic_one() -> None:
    """Planned at the synthetic 0.1 s step, a trained job's traffic read eight times too high and every region got
    cadence 8 (found by the first training run: W and P2 trained far worse than N)."""
    trained = WanCase(preset="tiny", train_tokens=1_000_000)
    assert trained.prior_step_s == pytest.approx(8 * 128 * flops.flops_per_token(presets.model_config(InnerConfig(preset="tiny")))
                                                 / CPU_FLOPS_PRIOR * max(1.0, 8 / (os.cpu_count() or 1)))  # fmt: skip
    assert WanCase(preset="tiny").prior_step_s == 0.1
    w = layouts(trained, ["W"])[0]
    assert [w.cadence[r] for r in "abc"] == [1, 1, 1] and w.cadence["e"] > 1
    assert set(layouts(WanCase(preset="tiny"), ["W"])[0].cadence.values()) == {8}  # the synthetic step's plan


def test_unknown_layouts_are_refused_before_any_namespace_is_made() -> None:
    with pytest.raises(
        DdctlError,
        match=re.escape(
            "layouts must be some of N, N-rr, P2, W, W-direct (each may end @K, every region's cadence, +period/+staleness, "
            "how late updates are weighed, and /auto or /N, uploads in flight), got ['X']"
        ),
    ):
        layouts(WanCase(), ["X"])
    done = CliRunner().invoke(app, ["bench", "wan", "--layouts", "N,X", "--json"])
    assert done.exit_code == 2 and "layouts must be some of N, N-rr, P2, W, W-direct" in done.output
    done = CliRunner().invoke(app, ["bench", "wan", "--step", "0", "--json"])
    assert done.exit_code == 2 and "step_s must be in [0.01, 60] seconds, got 0.0" in done.output


def test_the_wan_table_shows_the_rows_figures() -> None:
    from rich.console import Console

    from ddctl.bench.report import wan_table

    sites = {"a": {"measured": 0.71, "predicted_at_pace": 0.66}, "e": {"measured": 0.42, "predicted_at_pace": 0.5}}
    row = {"layout": "W", "shards": [{"site": "a"}, {"site": "b"}], "cadence": {"a": 1, "e": 8}, "in_flight": 1,
           "efficiency": 0.654, "fresh": 0.321, "x_first": 2.06, "sites": sites}  # fmt: skip
    case = {"links_mbit": {"a": (10, 10), "e": (0.5, 0.5)}, "learners": {"a": 2, "e": 1}, "preset": "micro", "fragments": 6,
            "inner_steps": 8, "step_s": 0.1}  # fmt: skip
    console = Console(width=220, record=True)
    console.print(wan_table({"case": case, "rows": [row]}))
    text = console.export_text()
    for cell in ("W", "a,b", "1/8", "0.654", "0.321", "2.06", "0.71", "0.66", "10/0.5 Mbit/s", "learners 2/1"):
        assert cell in text, cell
    assert "val_bpb" not in text
    console = Console(width=220, record=True)
    console.print(wan_table({"case": case | {"train_tokens": 10**6}, "rows": [row | {"val_bpb": 3.41234}]}))
    assert "val_bpb" in (trained := console.export_text()) and "3.4123" in trained


@NEEDS_ROOT
def test_the_emulated_wan_carries_traffic_between_regions_at_the_slower_links_rate_and_counts_it() -> None:
    with wan("ddwant", {"fast": (40.0, 40.0), "slow": (4.0, 4.0)}) as net:
        fast, slow = net.regions["fast"], net.regions["slow"]
        sink = "import socket,sys\ns=socket.socket();s.bind((sys.argv[1],9999));s.listen();print('ready',flush=True)\n"
        sink += "c,_=s.accept();n=0\nwhile (d:=c.recv(65536)): n+=len(d)\nprint(n)"
        server = subprocess.Popen(slow.command("python3", "-c", sink, slow.ip), stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline() == "ready\n"  # listening: the sender may connect
        before, started = net.sent(), time.monotonic()
        send = "import socket,sys\ns=socket.create_connection((sys.argv[1],9999));s.sendall(b'x'*1000000);s.close()"
        subprocess.run(fast.command("python3", "-c", send, slow.ip), check=True, timeout=60)
        received = int(server.communicate(timeout=60)[0])
        took, after = time.monotonic() - started, net.sent()
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert slow.namespace in namespaces and net.router in namespaces
    assert received == 1_000_000
    assert took >= 0.8 * 1_000_000 * 8 / 4e6  # the slow region's downlink bounds it
    assert after["fast"][0] - before["fast"][0] >= 1_000_000  # out of fast's uplink
    assert after["slow"][1] - before["slow"][1] >= 1_000_000  # into slow's downlink
    assert after["slow"][0] - before["slow"][0] < 200_000  # only acknowledgements go back
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert slow.namespace not in left and net.router not in left


@pytest.mark.slow
@NEEDS_ROOT
def test_one_synchronizer_against_the_full_scheduler_over_the_wan() -> None:
    from ddctl.bench.wan import measure_wan

    said: list[str] = []
    # The steady window starts once every learner has stepped. On a loaded CI machine eight learners importing torch on
    # two cores started 14 s apart, leaving a 16 s run a window of 0.17 s (its figures then read 3% off through the
    # rounding of window_s alone, and no region was due to send in it). They now start together (--start-when); the
    # run stays at 24 s for the regions due to send in the window.
    result = measure_wan(WanCase(seconds=24.0), ["N", "W"], said.append)
    assert said[0].startswith("building the WAN: 5 regions") and said[-2].startswith("layout W (2 of 2): 3 shard(s)")
    assert said[-1].startswith("layout W: efficiency ") and said[-1].endswith("books balanced: True")
    n, w = result["rows"]
    assert (n["layout"], w["layout"]) == ("N", "W")
    for row in (n, w):
        ledger = row["ledger"]
        assert row["balanced"]
        assert row["efficiency"] == pytest.approx((ledger["merged"] + ledger["late_merged"]) / row["trained_tokens"], abs=1e-4)
        assert 0 < row["efficiency"] <= 1
        assert row["fresh"] == pytest.approx(ledger["merged"] / row["trained_tokens"], abs=1e-4)
        assert row["fresh"] <= row["efficiency"]
        assert row["window_s"] >= 0.6 * 24.0, row["layout"]  # started together: 21 s measured here, 13-16 s before
        for region, site in row["sites"].items():
            up_mbit, down_mbit = result["case"]["links_mbit"][region]
            busier = max(site["bytes_up"] * 8 / up_mbit, site["bytes_down"] * 8 / down_mbit) / row["window_s"] / 1e6
            assert site["measured"] == pytest.approx(busier, rel=0.01), (row["layout"], region, row["window_s"])
        # A region due to send twice in the window carried traffic; a slow one at cadence 8 sends every 64 steps
        # (6.4 s and more), which a 6-9 s window can miss entirely (CI saw 0 bytes there once).
        period = {r: row["cadence"][r] * result["case"]["inner_steps"] * row["step_s"][r] for r in row["sites"]}
        due = [r for r in row["sites"] if 2 * period[r] <= row["window_s"]]
        assert {"a", "b", "c"} <= set(due), (row["layout"], row["window_s"], period)
        assert all(row["sites"][r]["bytes_down"] > 0 < row["sites"][r]["bytes_up"] for r in due), (row["layout"], row["sites"])
    assert n["relays"] == {} and set(w["relays"]) == {"a", "b", "c"}
    for region, carried in w["relays"].items():  # each version crossed into the region once, for its two learners
        assert carried["refused_in"] == 0 and carried["bytes_out"] > 1.3 * carried["bytes_in"] > 0, (region, carried)
        assert carried["bytes_out"] == pytest.approx(w["regions"][region]["bytes_down"], rel=0.1), (region, carried)
    assert w["efficiency"] > n["efficiency"]  # the site a synchronizer alone overloads (measured 2x here)
    assert w["x_first"] == pytest.approx(w["efficiency"] / n["efficiency"], rel=1e-3)
