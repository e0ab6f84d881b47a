"""The dashboard: snapshots recorded from real dry runs, drawn with rich's recording console."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ddctl.control.state import InstanceRecord
from ddctl.dashboard.render import accelerator_label, render, sparkline
from ddctl.dashboard.snapshot import from_recording, learner_state

DATA = Path(__file__).parent / "data" / "dashboard"


def load(name: str, *, unreachable_for: float | None = None) -> dict[str, Any]:
    return from_recording(json.loads((DATA / name).read_text()), unreachable_for=unreachable_for)


def screen(snapshot: dict[str, Any], width: int, height: int) -> list[str]:
    console = Console(record=True, width=width, height=height, color_system=None, file=io.StringIO())
    console.print(render(snapshot, width, height))
    return console.export_text().rstrip("\n").splitlines()


def test_a_running_job_fits_80x24_with_every_learner_and_the_global_panel() -> None:
    s = load("running_3.json")
    lines = screen(s, 80, 24)
    text = "\n".join(lines)
    assert len(lines) <= 24 and max(map(len, lines)) <= 80
    assert s["run"] in lines[0] and "syncer ok" in lines[0] and "rounds" in lines[0]
    for learner in ("L0", "L1", "L2"):
        assert any(learner in line and "training" in line for line in lines), learner
    assert "K=1" in text and "goodput" in text and "uptime" in text and "data-parallel" in text
    assert "balanced" in text and "events" in text and "L1 joined (eu-west)" in text


def test_a_wide_terminal_shows_every_column() -> None:
    lines = screen(load("running_3.json"), 160, 40)
    header = next(line for line in lines if "learner" in line and "state" in line)
    for column in ("rtt ms", "pre", "$/h", "provider/zone"):
        assert column in header
    assert any("process/us-east-a" in line for line in lines)


def test_a_preempted_region_shows_its_learner_preempted_and_the_event() -> None:
    s = load("preempted.json")
    states = {learner["id"]: learner["state"] for region in s["regions"] for learner in region["learners"]}
    assert "preempted" in states.values() or "rejoining" in states.values(), states
    victim = next(i for i, st in states.items() if st in ("preempted", "rejoining"))
    text = "\n".join(screen(s, 100, 30))
    assert f"{victim} (eu-west) spot notice" in text and f"{victim} (eu-west) preempted" in text
    row = next(learner for region in s["regions"] for learner in region["learners"] if learner["id"] == victim)
    assert row["preemptions"] == 1


def test_an_unreachable_syncer_shows_how_stale_the_screen_is_instead_of_freezing() -> None:
    s = load("running_3.json", unreachable_for=42)
    assert s["syncer"]["reachable"] is False and s["syncer"]["age_s"] >= 42
    lines = screen(s, 80, 24)
    assert "syncer unreachable" in lines[0] and "42s ago" in "\n".join(lines[:3])
    assert any("L1" in line for line in lines)  # the last known learners are still drawn


def test_sixteen_learners_grow_with_the_terminal() -> None:
    s = load("running_16.json")
    assert sum(len(r["learners"]) for r in s["regions"]) == 16
    small = screen(s, 80, 24)
    assert len(small) <= 24 and any(re.match(r"\+\d+ more +learners", line) for line in small)
    big = screen(s, 120, 50)
    assert not any("more" in line for line in big)
    assert all(any(f"L{i} " in line for line in big) for i in range(16))


def test_the_committed_svg_is_a_recorded_screen() -> None:
    svg = (Path(__file__).parents[1] / "docs" / "dashboard.svg").read_text()
    assert svg.startswith("<svg") and "spot" in svg and "notice" in svg


def test_states_and_sparkline() -> None:
    record = InstanceRecord("r", "L0", "eu", "docker", "learner", "deploying", "", 0.0, {})
    assert learner_state(record, None) == "provisioning"
    assert learner_state(replace(record, provider_id="c1"), None) == "deploying"
    assert learner_state(record, {"live": True}) == "training"
    assert learner_state(replace(record, state="preempted"), {"live": False, "state": "gone"}) == "preempted"
    assert learner_state(replace(record, state="running"), {"live": False, "state": "gone"}) == "gone"
    assert sparkline([3.0, 2.5, 2.0, 1.5], 16) == "█▆▃▁"
    assert sparkline([], 8) == ""


@pytest.mark.parametrize("name", ["running_3.json", "preempted.json", "running_16.json"])
def test_status_json_keeps_the_keys_scripts_rely_on(name: str) -> None:
    s = load(name)
    assert {"run", "rounds", "regions"} <= set(s)
    for region in s["regions"]:
        assert {"name", "provider", "learners"} <= set(region)
        for learner in region["learners"]:
            assert {"id", "state", "step", "tokens_per_s", "up_mbps", "down_mbps"} <= set(learner)
    json.dumps(s)  # plain data


def test_watch_without_a_terminal_prints_plain_snapshots_while_the_syncer_is_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    import yaml

    from ddctl.config.regions import job_config, load_regions
    from ddctl.control.credentials import init_job_dir
    from ddctl.control.rundir import run_dir
    from ddctl.control.state import State
    from ddctl.dashboard.watch import watch

    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    spec = tmp_path / "regions.yaml"
    spec.write_text(yaml.safe_dump({"run": "w", "syncer": "east", "regions": [{"name": "east", "provider": "process"}]}))
    root = run_dir("w-1")
    init_job_dir(root / "job", job_config(load_regions(spec)), "w-1", ["127.0.0.1"])
    (root / "syncer.url").write_text("https://127.0.0.1:9")  # nothing listens there
    out = io.StringIO()
    with State() as state:
        state.create_run("w-1", str(spec), str(root / "job"), {"provider": "process"})
        state.put_instance(InstanceRecord("w-1", "L0", "east", "process", "learner", "deploying", "1", 0.0, {}))
        started = time.monotonic()
        watch("w-1", state, Console(file=out, width=100), every_s=0.3, frames=3)
    assert time.monotonic() - started < 10  # drawing never waits on the dead syncer
    text = out.getvalue()
    assert "\x1b[" not in text  # no colour and no cursor movement off a terminal
    assert text.count("syncer unreachable") == 3 and text.count("L0") >= 3


def test_a_suspended_learner_and_a_degraded_fragment_are_on_the_screen() -> None:
    raw = json.loads((DATA / "running_3.json").read_text())
    status = raw["syncer"]["status"]
    victim = status["learners"][-1]
    victim.update(state="suspended", live=False, rejections=3, suspended="3 rejected updates, the last: NaN")
    status.update(
        degraded=[{"fragment": 3, "reason": "round of fragment 3 failed: RuntimeError: a bug"}],
        suspended=[victim["id"]],
        ledger={**status["ledger"], "rejected": 8192 * status["fragments"]},
        tokens={"trained": 200_000, "budget": 1_000_000, "merged": 150_000, "rejected": 8192},
    )
    status["events"].append({"t": status["time"], "event": "suspended", "learner": victim["id"], "reason": "3 rejected updates"})
    s = from_recording(raw)
    lines = screen(s, 80, 24)
    text = "\n".join(lines)
    assert len(lines) <= 24 and max(map(len, lines)) <= 80
    assert any(victim["id"] in line and "suspended" in line for line in lines[:8])  # the table's state column
    assert f"! {victim['id']} suspended · rejected 8.2k tokens · f3 degraded: round of fragment 3" in text
    assert "tokens trained 200.0k of 1.0M · merged 150.0k" in text  # tokens, not fragment-tokens
    assert f"{victim['id']} suspended: 3 rejected updates" in text  # and the event
    healthy = "\n".join(screen(load("running_3.json"), 80, 24))
    assert "!" not in healthy and "rejected" not in healthy  # nothing to say when all is well


def test_learners_show_their_accelerator_and_mfu_and_a_dash_where_unknown() -> None:
    raw = json.loads((DATA / "running_3.json").read_text())
    gear = [("NVIDIA H100 80GB HBM3", 8, 1_234_567.0, 0.4123), ("cpu", 1, 6_000.0, None), ("", 1, 5_000.0, None)]
    for entry, (name, devices, rate, mfu) in zip(raw["syncer"]["status"]["learners"], gear, strict=True):
        entry.update(accelerator=name, devices=devices, tokens_per_s=rate, mfu=mfu, memory_gb=80.0)
    s = from_recording(raw)
    rows = {learner["id"]: learner for region in s["regions"] for learner in region["learners"]}
    assert (rows["L0"]["accelerator"], rows["L0"]["devices"], rows["L0"]["mfu"]) == ("NVIDIA H100 80GB HBM3", 8, 0.4123)
    wide = screen(s, 160, 40)
    assert "accelerator" in wide[1] and "mfu" in wide[1]
    l0, l1, l2 = (next(line for line in wide if f" L{i} " in line) for i in range(3))
    assert "H100 80GB HBM3 x8" in l0 and "NVIDIA" not in l0 and "41.2%" in l0 and "1,234,567" in l0
    assert re.search(r" cpu +\d", l1) and re.search(r"6,000 +— ", l1)
    assert re.search(r"training +— +\d", l2) and re.search(r"5,000 +— ", l2)
    small = screen(s, 80, 24)  # wider numbers: the least missed columns go, no cell is cut
    assert max(map(len, small)) <= 80 and "…" not in "\n".join(small[:6])
    assert any("41.2%" in line and "1,234,567" in line for line in small)


def test_a_fleet_that_never_said_its_accelerator_gets_no_column_of_dashes() -> None:
    lines = screen(load("running_3.json"), 160, 40)
    assert "accelerator" not in lines[1] and "mfu" in lines[1]
    assert "in fl" not in lines[1]  # nor its uploads in flight (recorded before learners reported them)


def test_uploads_in_flight_show_on_a_wide_terminal_where_learners_report_them() -> None:
    s = load("running_3.json")
    for region in s["regions"]:
        for learner in region["learners"]:
            learner["uploads_in_flight"] = {"L0": 2, "L1": 1}.get(learner["id"])  # L2: too old to say
    wide = screen(s, 160, 40)
    header = next(i for i, line in enumerate(wide) if "learner" in line and "state" in line)
    column = wide[header].index("in fl") + len("in fl")  # right-aligned under its title
    cells = {line.split()[1]: line[column - 1] for line in wide[header + 2 : header + 5]}
    assert cells == {"L0": "2", "L1": "1", "L2": "-"}, wide
    assert not any("in fl" in line for line in screen(s, 100, 30))  # the first column a narrower screen drops


@pytest.mark.parametrize(
    ("name", "devices", "label"),
    [("NVIDIA H100 80GB HBM3", 8, "H100 80GB HBM3 x8"), ("NVIDIA L4", 1, "L4"), ("cpu", 1, "cpu"), ("", 1, "—"), ("", None, "—")],
)
def test_accelerator_labels(name: str, devices: int | None, label: str) -> None:
    assert accelerator_label(name, devices) == label


def test_a_learner_over_several_vms_is_one_row_priced_for_all_of_them() -> None:
    """Its VMs cost what they cost: the region's $/h counts each, the learner's row sums them; no row per VM."""
    from ddctl.dashboard.snapshot import RegionInfo, RunRecords, SyncerView, build

    def vm(name: str, node: int | None) -> InstanceRecord:
        detail = {} if node is None else {"learner": "L1", "node": node}
        return InstanceRecord("r", name, "west", "aws", "learner", "running", f"i-{name}", 0.0, detail)

    records = RunRecords(
        run="r",
        provider="aws",
        instances=[vm("L0", None), vm("L1", 0), vm("L1-n1", 1), vm("L1-n2", 2)],
        regions={"west": RegionInfo("aws", ("us-west-2a",), 2.5)},
    )
    status = {"learners": [{"id": "L1", "live": True, "devices": 24, "step": 7}], "rounds": 1}
    snapshot = build(records, SyncerView(status, 0.0), 0.0)
    [west] = snapshot["regions"]
    rows = {row["id"]: row for row in west["learners"]}
    assert list(rows) == ["L0", "L1"] and west["dollars_per_hour"] == 4 * 2.5
    assert (rows["L1"]["vms"], rows["L1"]["dollars_per_hour"], rows["L1"]["devices"]) == (3, 3 * 2.5, 24)
    assert (rows["L0"]["vms"], rows["L0"]["dollars_per_hour"]) == (1, 2.5)


@pytest.mark.parametrize("state", ["finished", "given_up"])
def test_a_learner_whose_machine_was_removed_costs_nothing_in_its_row_or_region(state: str) -> None:
    """A finished learner's VM and a given-up one's are removed by the controller: $/h is what still runs."""
    from ddctl.dashboard.snapshot import RegionInfo, RunRecords, SyncerView, build

    records = RunRecords(
        run="r",
        provider="aws",
        instances=[
            InstanceRecord("r", name, "west", "aws", "learner", s, f"i-{name}", 0.0, {})
            for name, s in (("L0", state), ("L1", "running"))
        ],
        regions={"west": RegionInfo("aws", ("us-west-2a",), 2.5)},
    )
    status = {"learners": [{"id": "L1", "live": True, "step": 7}], "rounds": 1}
    [west] = build(records, SyncerView(status, 0.0), 0.0)["regions"]
    rows = {row["id"]: row for row in west["learners"]}
    assert rows["L0"]["state"] == state.replace("_", " ") and rows["L0"]["dollars_per_hour"] == 0.0
    assert rows["L1"]["dollars_per_hour"] == 2.5 and west["dollars_per_hour"] == 2.5


def test_a_finished_run_with_a_checkpoint_says_how_to_pull_its_model() -> None:
    from ddctl.dashboard.render import finished_lines

    job = {"phase": "finished", "summary": {"reason": "done", "val_bpb": 2.5, "tokens": {}, "checkpoint": "/s/ckpt-000004"}}
    [line] = finished_lines({"run": "r7", "job": job})
    assert "model: ddctl pull r7" in line.plain
    [line] = finished_lines({"run": "r7", "job": {**job, "summary": {**job["summary"], "checkpoint": ""}}})
    assert "ddctl pull" not in line.plain  # a summary from before checkpoints: nothing to point at


def test_each_learner_shows_how_often_it_sends_and_a_dash_before_the_syncer_says() -> None:
    raw = json.loads((DATA / "running_3.json").read_text())
    entries = raw["syncer"]["status"]["learners"]
    for entry, cadence in zip(entries, (1, 4), strict=False):  # the third learner's syncer status predates cadences
        entry["cadence"] = cadence
    entries[2].pop("cadence", None)
    s = from_recording(raw)
    assert {e["id"]: e["cadence"] for r in s["regions"] for e in r["learners"]} == {"L0": 1, "L1": 4, "L2": None}
    wide = screen(s, 160, 40)
    assert "sends" in wide[1]
    l0, l1, l2 = (next(line for line in wide if f" L{i} " in line) for i in range(3))
    assert "every 1H" in l0 and "every 4H" in l1 and "every" not in l2 and "—" in l2
    assert max(map(len, screen(s, 80, 24))) <= 80  # on a narrow terminal the column is among the first to go


def test_the_syncers_own_site_link_is_on_the_screen_once_it_has_measured_it() -> None:
    raw = json.loads((DATA / "running_3.json").read_text())
    raw["syncer"]["status"]["site"] = {"name": "us-east", "up_mbps": 48.25, "down_mbps": None}
    s = from_recording(raw)
    assert s["site"] == {"name": "us-east", "up_mbps": 48.25, "down_mbps": None}
    text = "\n".join(screen(s, 160, 40))
    assert "syncer's site us-east: 48.2 / — Mbit/s out / in" in text
    for unmeasured in ({"name": "us-east", "up_mbps": None, "down_mbps": None}, {"up_mbps": "fast"}, "x", None):
        raw["syncer"]["status"]["site"] = unmeasured
        quiet = from_recording(raw)
        assert quiet["site"] is None and "syncer's site" not in "\n".join(screen(quiet, 160, 40))
