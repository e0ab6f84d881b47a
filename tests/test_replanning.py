"""The running re-planner: link bounds from what shards measured, hostile statuses, and moves made on real shards."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.control.replanning import Crossing, Replanning, link_bounds, measured_sites, read_status, watch
from ddctl.errors import DdctlError
from ddctl.local.service import LocalSyncer
from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.core.replan import Move, Replan, Replanner, ReplanSettings
from ddctl_agents.core.shardmap import ShardMap
from ddctl_agents.core.shardplan import Traffic
from ddctl_agents.core.siteload import Site
from tests.shard_harness import shards, status

__all__ = ["shards"]  # fixture
MBIT = 1e6 / 8
REGIONS = {"a", "b", "c"}
runner = CliRunner()


def priors() -> list[Site]:
    """S0 runs at a, S1 at b; c's two learners have no shard. Links of 10 Mbit/s each way, until measured."""
    return [
        Site(name="a", learners=1, up_bytes_s=10 * MBIT, down_bytes_s=10 * MBIT, step_s=0.1),
        Site(name="b", learners=1, up_bytes_s=10 * MBIT, down_bytes_s=10 * MBIT, step_s=0.1),
        Site(name="c", learners=2, up_bytes_s=10 * MBIT, down_bytes_s=10 * MBIT, step_s=0.1),
    ]


def test_a_crossing_bounds_both_sites_links_in_its_direction_and_the_best_bound_wins() -> None:
    crossings = [
        Crossing(shard_site="a", region="c", up=3e5, down=9e5),  # c's uploads into a, a's versions out to c
        Crossing(shard_site="b", region="c", up=5e5, down=None),
        Crossing(shard_site="a", region="a", up=1e9, down=1e9),  # inside site a: no link crossed, no bound
    ]
    up, down = link_bounds(crossings)
    assert up == {"c": 5e5, "a": 9e5}  # c's uplink: the better of its two uploads; a's uplink: the versions it sent c
    assert down == {"a": 3e5, "b": 5e5, "c": 9e5}


def test_measured_sites_replace_what_was_measured_and_scale_the_rest_as_the_measurements_read() -> None:
    sites = measured_sites(priors(), ({"c": 5e5, "a": 2.5e5}, {"a": 3e5}), {"c": [0.3, 0.1, 0.2], "b": []}, hosts={"a", "b"})
    by = {s.name: s for s in sites}
    # measured up: c at 0.4 of its prior, a at 0.2; b's unmeasured uplink reads as the median, 0.3 of its prior
    # measured down: a at 0.24; b's and c's unmeasured downlinks read at 0.24 of theirs
    assert (by["c"].up_bytes_s, by["c"].down_bytes_s, by["c"].step_s) == (5e5, pytest.approx(3e5), 0.2)  # the median step
    assert (by["a"].up_bytes_s, by["a"].down_bytes_s, by["a"].step_s) == (2.5e5, 3e5, 0.1)
    assert (by["b"].up_bytes_s, by["b"].down_bytes_s) == (pytest.approx(3.75e5), pytest.approx(3e5)) and by["b"].step_s == 0.1
    assert [s.candidate for s in sites] == [True, True, False]
    untouched = measured_sites(priors(), ({}, {}), {}, hosts={"a", "b"})
    assert [(s.up_bytes_s, s.down_bytes_s) for s in untouched] == [(s.up_bytes_s, s.down_bytes_s) for s in priors()]


HOSTILE: list[Any] = [
    None,
    [],
    "status",
    {"regions": "all", "learners": 7},
    {"regions": [None, 3, {"name": 5}, {"name": "z", "up_mbps": 1}], "learners": [None, {"region": ["a"]}]},
]


@pytest.mark.parametrize("status", HOSTILE)
def test_a_malformed_status_reads_as_nothing_measured(status: Any) -> None:
    seen = read_status(status, "a", REGIONS)
    assert (seen.crossings, seen.steps, seen.cadence) == ((), {}, {})


def test_impossible_figures_in_a_status_are_dropped_one_by_one() -> None:
    bad_rates = [math.nan, math.inf, -1.0, 0, True, "10", 1e12, None]
    regions = [{"name": "c", "up_mbps": v, "down_mbps": 8.0} for v in bad_rates]
    learners: list[dict[str, Any]] = [
        {"region": "c", "live": True, "step_time_s": 0.25, "cadence": 2},
        {"region": "c", "live": True, "step_time_s": math.nan, "cadence": True},
        {"region": "c", "live": True, "step_time_s": 1e9, "cadence": 3},
        {"region": "c", "live": "yes", "step_time_s": 9.0, "cadence": 8},  # not live: its figures are not the region's
        {"region": "b", "live": False, "step_time_s": 9.0, "cadence": 8},
    ]
    seen = read_status({"regions": regions, "learners": learners}, "a", REGIONS)
    assert [c.up for c in seen.crossings] == [None] * len(bad_rates)
    assert {c.down for c in seen.crossings} == {1e6}  # 8 Mbit/s
    assert seen.steps == {"c": [0.25]} and seen.cadence == {"c": 2}


def test_the_loop_reports_a_failing_look_and_goes_on() -> None:
    looks: list[str] = []

    class Flaky(Replanning):
        def tick(self) -> dict[str, Any]:
            looks.append("tick")
            if len(looks) == 1:
                raise DdctlError("shard S1 answered garbage")
            return {"t": 0.0, "replan": {"moves": []}}

    loop = Flaky(urls=["https://x"], connect=lambda url: None,  # type: ignore[arg-type,return-value]
                 sites_of_shards={"S0": "a"}, priors=priors(), traffic=Traffic(up=(1,), down=(1,), inner_steps=8),
                 relays=False, planner=Replanner())  # fmt: skip
    events: list[dict[str, Any]] = []
    made = watch(loop, 0.0, until=lambda: len(looks) >= 3, on_event=events.append)
    assert made == 2 and "shard S1 answered garbage" in events[0]["error"] and events[1]["replan"] is not None


def test_shard_sites_must_be_regions_of_the_job() -> None:
    with pytest.raises(DdctlError, match="shards placed at z, which is not a region of the job; allowed: a, b, c"):
        Replanning(urls=["https://x"], connect=lambda url: None,  # type: ignore[arg-type,return-value]
                   sites_of_shards={"S0": "z"}, priors=priors(), traffic=Traffic(up=(1,), down=(1,), inner_steps=8),
                   relays=False, planner=Replanner())  # fmt: skip


class Measuring(SyncerClient):
    """A real client whose status carries the link rows the test says its shard measured (the rest is the shard's)."""

    rows: dict[str, list[dict[str, Any]]] = {}
    phase: str | None = None
    """The job's phase this shard says, where the test says one."""

    def status(self) -> dict[str, Any]:
        answer = super().status()
        answer["regions"] = self.rows.get(self.url, [])
        if self.phase is not None:
            answer["job"]["phase"] = self.phase
        return answer


@pytest.mark.slow
def test_a_halved_shard_link_moves_one_fragment_once_and_a_broken_handoff_is_finished(shards: list[LocalSyncer]) -> None:
    s0, s1 = shards
    rows = Measuring.rows = {s0.url: [], s1.url: []}
    traffic = Traffic(up=(20_000,) * 4, down=(80_000,) * 4, inner_steps=8)
    loop = Replanning(urls=[s0.url, s1.url], connect=s0.connector(Measuring), sites_of_shards={"S0": "a", "S1": "b"},
                      priors=priors(), traffic=traffic, relays=False,
                      planner=Replanner(ReplanSettings(confirmations=2, dwell_s=0)))  # fmt: skip
    quiet = loop.tick()  # the priors: both shard sites alike, nothing to gain
    assert quiet["replan"] is None and quiet["streak"] == 0 and quiet["epoch"] == 1 and quiet["floor"] == 0.5
    assert quiet["sites"]["b"] == {"up_mbps": 10.0, "down_mbps": 10.0, "measured": [False, False], "step_s": 0.1}

    # b's link is measured at 5 Mbit/s each way: c's learners' uploads into S1, S1's versions out to them
    rows[s1.url] = [{"name": "c", "up_mbps": 5.0, "down_mbps": 5.0}, {"name": "b", "up_mbps": 900.0, "down_mbps": 900.0}]
    rows[s0.url] = [{"name": "c", "up_mbps": 10.0, "down_mbps": 10.0}]
    first = loop.tick()
    assert first["sites"]["b"]["up_mbps"] == 5.0 and first["sites"]["b"]["measured"] == [True, True]
    assert first["replan"] is None and first["streak"] == 1 and first["utilisation"] > first["best"] / 0.8
    second = loop.tick()
    replan = second["replan"]
    assert replan is not None and [(m["from"], m["to"], m["shard"]) for m in replan["moves"]] == [("b", "a", "S0")]
    moved = replan["moves"][0]["fragment"]
    assert moved in (1, 3) and replan["after"] < replan["before"] * 0.8
    owned = [status(s)["shard"]["owned"] for s in shards]
    assert owned == [sorted([0, 2, moved]), [4 - moved]] and status(s0)["shard"]["epoch"] == 2
    for _ in range(3):  # the same measurements again: nothing left to gain
        again = loop.tick()
        assert again["replan"] is None and again["utilisation"] == pytest.approx(again["best"])

    # a handoff S1 made whose other half never happened (its coordinator died): the next look finishes it
    left = 4 - moved
    admin = s1.client()
    try:
        admin.hand_out(left, "S0", 3)
    finally:
        admin.close()
    finishing = loop.tick()
    assert finishing["finished"] == [left] and finishing["epoch"] == 3
    assert [status(s)["shard"]["owned"] for s in shards] == [[0, 1, 2, 3], []]

    # now a's link reads slow, which would move fragments to b; but once a shard says the job is finishing, nothing moves
    rows[s0.url] = [{"name": "c", "up_mbps": 5.0, "down_mbps": 5.0}, {"name": "a", "up_mbps": 900.0, "down_mbps": 900.0}]
    rows[s1.url] = [{"name": "c", "up_mbps": 10.0, "down_mbps": 10.0}]
    try:
        for phase in ("finishing", "finished"):
            Measuring.phase = phase
            for _ in range(3):
                ended = loop.tick()
                assert ended["skipped"] == "the job is finishing" and ended.get("replan") is None and ended["epoch"] == 3
        assert [status(s)["shard"]["owned"] for s in shards] == [[0, 1, 2, 3], []]
        Measuring.phase = None  # the same readings while training: the look before the finishing ones saw the gain too
        training = loop.tick()
        assert training["replan"] is not None and {(m["from"], m["to"]) for m in training["replan"]["moves"]} == {("a", "b")}
    finally:
        Measuring.phase = None


@pytest.mark.slow
def test_the_command_looks_at_real_shards_and_refuses_bad_sites(tmp_path: Path, shards: list[LocalSyncer]) -> None:
    regions = tmp_path / "regions.yaml"
    raw = {
        "run": "replan",
        "synchronizer": {"shards": 2, "regions": ["a", "b"], "replan": {"confirmations": 2, "dwell_s": 0}},
        "regions": [{"name": n, "provider": "process", "learners": k} for n, k in (("a", 1), ("b", 1), ("c", 2))],
    }
    regions.write_text(yaml.safe_dump(raw))
    base = ["syncer", "replan", str(shards[0].job_dir), "--regions", str(regions)]
    base += [a for s in shards for a in ("--syncer", s.url)]
    looked = runner.invoke(app, [*base, "--site", "S0=a", "--site", "S1=b", "--every", "0.5", "--for", "1.2", "--json"])
    assert looked.exit_code == 0, looked.output
    events = [json.loads(line) for line in looked.stdout.splitlines()]
    assert len(events) >= 2 and all(e["replan"] is None and e["epoch"] == 1 for e in events)
    assert set(events[0]["sites"]) == {"a", "b", "c"} and events[0]["sites"]["c"]["measured"] == [False, False]
    bad = runner.invoke(app, [*base, "--site", "S0", "--for", "1"])
    assert bad.exit_code == 2 and "--site takes SHARD=REGION (S0=us-east-1, ...), got 'S0'" in bad.output
    nowhere = runner.invoke(app, [*base, "--site", "S0=a", "--site", "S1=z", "--for", "1"])
    assert nowhere.exit_code == 2 and "shards placed at z, which is not a region of the job; allowed: a, b, c" in nowhere.output


def test_a_move_that_fails_ends_the_replan_there_and_is_reported_with_it() -> None:
    class Gone:
        def shards(self) -> dict[str, Any]:
            raise DdctlError("shard S1 is gone")

        def close(self) -> None:
            pass

    loop = Replanning(urls=["https://s0", "https://s1"], connect=lambda url: Gone(),  # type: ignore[arg-type,return-value]
                      sites_of_shards={"S0": "a", "S1": "b"}, priors=priors(),
                      traffic=Traffic(up=(1,) * 4, down=(1,) * 4, inner_steps=8), relays=False, planner=Replanner())  # fmt: skip
    decision = Replan(moves=(Move(fragment=1, source="b", target="a"), Move(fragment=3, source="b", target="a")),
                      before=1.0, after=0.7, cause="b halved")  # fmt: skip
    done = loop._carry_out(decision, ShardMap(epoch=1, shards=("S0", "S1"), owners=(0, 1, 0, 1)))
    assert done["cause"] == "b halved" and done["before"] == 1.0 and done["after"] == 0.7
    assert done["moves"] == [{"fragment": 1, "from": "b", "to": "a", "shard": "S0", "error": "shard S1 is gone"}]
