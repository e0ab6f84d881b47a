"""Where a run's relays show: the synchronizer counts each by its region (``service/relay_feeds.py``), a sharded
job sums them, and the dashboard gives them a line; what a synchronizer says of them is checked before it is drawn."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from ddctl.control.shard_status import relay_reading
from ddctl.dashboard.render import render
from ddctl.dashboard.sharded import relays
from ddctl.dashboard.snapshot import from_recording
from ddctl_agents.core.links import LearnerLinks
from ddctl_agents.relay import identity, region_of
from ddctl_agents.service.metrics import metrics
from ddctl_agents.service.observability import status
from ddctl_agents.service.relay_feeds import RelayFeeds
from ddctl_agents.service.runtime import SyncerRuntime
from ddctl_agents.service.settings import ServiceSettings
from ddctl_agents.train.assembly import Assembly
from tests.builders import small_run

DATA = Path(__file__).parent / "data" / "dashboard"


def test_a_relay_is_known_by_its_identity_and_nobody_else_is() -> None:
    assert region_of(identity("eu-west")) == "eu-west"
    for who in ("L0", "admin", "relay-", "relay", "xrelay-east"):
        assert region_of(who) is None, who


def test_the_synchronizer_counts_each_relays_streams_bytes_and_when_it_last_heard() -> None:
    feeds = RelayFeeds()
    feeds.opened("east", now=10.0, address="10.0.0.5:29401")
    feeds.sent("east", 1000, now=11.0)
    feeds.sent("east", 0, now=12.5)  # a keep-alive: nothing sent, but it was there
    feeds.opened("east", now=13.0, address="10.0.0.5:29401")  # it reconnected before the old stream noticed it was gone
    feeds.closed("east", now=14.0)
    east = {"streams": 1, "bytes": 1000, "seen_s_ago": 6.0, "address": "10.0.0.5:29401", "learners": 0}
    assert feeds.view(now=20.0, learners={}, live=set()) == {"east": east}
    feeds.closed("east", now=15.0)
    feeds.closed("east", now=16.0)  # never below none
    assert feeds.view(now=16.0, learners={}, live=set())["east"]["streams"] == 0


def test_a_sharded_jobs_relay_is_the_sum_of_what_each_shard_sent_it() -> None:
    s0 = {
        "east": {"streams": 1, "bytes": 300, "seen_s_ago": 2.0, "address": "10.0.0.5:29401", "learners": 2},
        "west": {"streams": 0, "bytes": 10, "seen_s_ago": 50.0},  # a synchronizer from before relays said more
    }
    # heard last, it moved; here one of its learners reads this shard's stream itself
    s1 = {"east": {"streams": 1, "bytes": 200, "seen_s_ago": 0.5, "address": "10.0.0.7:29401", "learners": 1}}
    assert relays([s0, s1, None]) == {
        "east": {"streams": 2, "bytes": 500, "seen_s_ago": 0.5, "address": "10.0.0.7:29401", "learners": 2},
        "west": {"streams": 0, "bytes": 10, "seen_s_ago": 50.0, "address": "", "learners": None},
    }


def test_what_a_synchronizer_says_of_its_relays_is_kept_only_whole() -> None:
    good = {"streams": 1, "bytes": 5, "seen_s_ago": 0.25, "address": "[fd00::5]:29401", "learners": 3}
    hostile: dict[str, Any] = {
        "east": good,
        "east\n": good,  # a region named to forge a line where it is drawn
        "l1": {**good, "learners": -1},
        "l2": {**good, "learners": True},
        "l3": {**good, "learners": 2.5},
        "a1": {**good, "address": "0.0.0.0:29401"},  # not an address to dial
        "a2": {**good, "address": "10.0.0.5:29401\nforged log line"},
        "a3": {**good, "address": "FD00::5:29401"},  # not as the relay's own check writes it
        "a4": {**good, "address": 29401},
        "bad region": good,
        "west": {**good, "bytes": -1},
        "north": {**good, "streams": True},
        "south": {**good, "seen_s_ago": float("nan")},
        "up": {**good, "seen_s_ago": "soon"},
        "down": "x",
    }
    assert relay_reading(hostile) == {"east": good}
    assert relay_reading("x") == relay_reading(None) == relay_reading([good]) == {}


def test_the_dashboard_shows_each_relay_and_one_that_is_down() -> None:
    raw = json.loads((DATA / "running_3.json").read_text())
    s = from_recording(raw)
    assert s["relays"] == {} and "relays " not in screen(s)
    raw["syncer"]["status"]["relays"] = {
        "east": {"streams": 1, "bytes": 12_345_678, "seen_s_ago": 0.3, "learners": 2},
        "north": {"streams": 1, "bytes": 1_000, "seen_s_ago": 0.3},  # a synchronizer that does not count its learners
        "west": {"streams": 0, "bytes": 4_000, "seen_s_ago": 42.0},
        "south": {"streams": "many"},
    }
    s = from_recording(raw)
    assert list(s["relays"]) == ["east", "north", "west"]
    text = screen(s)
    assert (
        "east: 12.3 MB pulled for 2 learners · north: 1.0 KB pulled · " in text
        and "west: down for 42 s (its learners pull from the shards)" in text
    )
    assert "south" not in text.split("relays ", 1)[1].splitlines()[0]


def screen(snapshot: dict[str, Any]) -> str:
    console = Console(record=True, width=160, height=40, color_system=None, file=io.StringIO())
    console.print(render(snapshot, 160, 40))
    return console.export_text()


def test_a_relays_downlink_is_the_downlink_of_its_regions_learners_behind_it() -> None:
    """The grace window's network slack needs each learner's downlink; a learner behind a relay reads nothing here."""
    feeds, links = RelayFeeds(), {"L9": LearnerLinks()}
    placed = {
        name: SimpleNamespace(region=region) for name, region in (("L0", "east"), ("L1", "east"), ("L2", "east"), ("L3", "west"))
    }
    feeds.direct["L1"] += 1  # L1 reads its own stream here (its relay is down): its own stream measures it
    live = {"L0", "L1", "L3"}  # L2 has left
    assert feeds.behind("east", placed, live) == ["L0"]
    feeds.observe("east", placed, live, links, 4_000_000, 0.5, kernel=True)
    assert links["L0"].down.send_time(8_000_000) is not None and set(links) == {"L0", "L9"}
    feeds.direct["L1"] -= 1  # its stream closed: behind the relay again
    assert feeds.behind("east", placed, live) == ["L0", "L1"]


def test_the_metrics_show_each_relay_as_the_status_page_does_and_the_learners_it_serves(tmp_path: Path) -> None:
    now = [500.0]

    async def scenario() -> tuple[dict[str, Any], str]:
        rt = SyncerRuntime(
            Assembly.build(small_run(learners=4)),
            ServiceSettings(state_dir=tmp_path, snapshot_every_s=3600),
            clock=lambda: now[0],
        )
        await rt.start()
        for name, region in (("L0", "east"), ("L1", "east"), ("L2", "east"), ("L3", "west")):
            await rt.register(name, 1, region)
        rt.streams.opened("east", now=now[0])
        rt.streams.sent("east", 2_500_000, now=now[0] + 1.0)
        rt.streams.direct["L2"] += 1  # L2 reads its own stream: not behind the relay
        rt.streams.opened("west", now=now[0])
        rt.streams.closed("west", now=now[0] + 2.0)  # west's relay has gone: L3, with no stream here, is not its reader
        now[0] += 4.0
        page, text = await rt.view(status), await rt.view(metrics)
        await rt.stop()
        return page, text

    page, text = asyncio.run(scenario())
    families = {f.name: f for f in text_string_to_metric_families(text)}

    def by_region(name: str) -> dict[str, float]:
        return {s.labels["region"]: s.value for s in families[name].samples if not s.name.endswith("_created")}

    assert by_region("ddctl_relay_streams") == {r: f["streams"] for r, f in page["relays"].items()} == {"east": 1, "west": 0}
    assert by_region("ddctl_relay_bytes_sent") == {r: f["bytes"] for r, f in page["relays"].items()} == {"east": 2.5e6, "west": 0}
    assert (
        by_region("ddctl_relay_seen_seconds")
        == {r: f["seen_s_ago"] for r, f in page["relays"].items()}
        == {"east": 3.0, "west": 2.0}
    )
    assert by_region("ddctl_relay_learners") == {r: f["learners"] for r, f in page["relays"].items()} == {"east": 2, "west": 0}
