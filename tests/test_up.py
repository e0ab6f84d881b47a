"""``ddctl up --dry-run`` with process regions, then status, logs and down (also with the state file gone)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.providers import linkshape
from ddctl.providers.process import ProcessProvider
from ddctl_agents.waiting import wait_until
from tests.builders import dry_run_up, instances_removed, regions_at

runner = CliRunner()
REGIONS = {
    "run": "dry",
    "syncer": "east",
    "training": {"preset": "tiny", "tokens": 2_000_000, "fragments": 4, "inner_steps": 8, "max_bytes": 1 << 21},
    "regions": [
        {"name": "east", "provider": "process", "learners": 1},
        {"name": "west", "provider": "process", "learners": 2},
    ],
}


@pytest.fixture
def regions_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return regions_at(tmp_path, monkeypatch, REGIONS)


def test_plan_creates_nothing_and_prices_local_regions_at_zero(regions_file: Path) -> None:
    result = runner.invoke(app, ["up", "-f", str(regions_file), "--plan", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert [i["role"] for i in plan["instances"]] == ["syncer", "learner", "learner", "learner"]
    assert [i["name"] for i in plan["instances"]] == ["syncer", "L0", "L1", "L2"]  # the names up gives them
    assert {i["action"] for i in plan["instances"]} == {"create"}  # nothing runs yet: up would create them all
    assert plan["max_dollars_per_hour"] == 0.0
    assert not (regions_file.parent / "home" / "runs").exists()


def plan_with_west(regions_file: Path, west: dict) -> dict:
    """``up --plan --json`` with the example's west region replaced by ``west``."""
    regions_file.write_text(yaml.safe_dump({**REGIONS, "regions": [REGIONS["regions"][0], west]}))
    result = runner.invoke(app, ["up", "-f", str(regions_file), "--plan", "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def test_the_plan_shows_each_regions_ranks_per_learner(regions_file: Path) -> None:
    plan = plan_with_west(regions_file, {"name": "west", "provider": "process", "learners": 2, "gpus": 2})
    assert plan["gpus"] == {"east": 1, "west": 2}
    assert plan["max_dollars_per_hour"] == 0.0  # a VM is a VM: ranks change no price
    text = runner.invoke(app, ["up", "-f", str(regions_file), "--plan"], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    rows = {line.split("│")[1].strip(): line.split("│")[5].strip() for line in text.stdout.splitlines() if "│ L" in line}
    assert "gpus" in text.stdout and rows == {"L0": "1", "L1": "2", "L2": "2"}


def test_a_bad_regions_file_is_refused_before_anything_starts(regions_file: Path) -> None:
    regions_file.write_text(yaml.safe_dump({**REGIONS, "syncer": "north"}))
    result = runner.invoke(app, ["up", "-f", str(regions_file), "--dry-run"])
    assert result.exit_code == 2 and "syncer: 'north' is not a region" in result.output


def test_without_a_docker_engine_the_dry_run_says_so_and_uses_processes(
    regions_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ddctl.config.regions import load_regions
    from ddctl.control.up import kinds_for

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    said: list[str] = []
    assert set(kinds_for(load_regions(regions_file), True, said.append).values()) == {"process"}
    assert said == []  # an all-process file never looks for an engine
    regions_file.write_text(yaml.safe_dump({**REGIONS, "regions": [{"name": "east", "provider": "docker"}]}))
    assert kinds_for(load_regions(regions_file), True, said.append) == {"east": "process"}
    assert said == [
        f"no Docker engine: {tmp_path}/no-docker.sock does not exist (start dockerd, or install Debian's docker.io); "
        "every region runs as local processes instead"
    ]


@pytest.mark.slow
def test_dry_run_trains_and_down_leaves_nothing(regions_file: Path) -> None:
    east, west = REGIONS["regions"]
    regions_file.write_text(yaml.safe_dump({**REGIONS, "regions": [east, {**west, "cadence": 2}]}))
    run = dry_run_up(regions_file)["run"]
    try:
        names = sorted(i.name for i in ProcessProvider().list_run(run))
        assert names == ["L0", "L1", "L2", "controller", "syncer"]  # found by their label

        def cadences() -> dict[str, Any] | None:
            status = json.loads(runner.invoke(app, ["status", "--json"]).stdout)
            found = {entry["id"]: entry["cadence"] for region in status["regions"] for entry in region["learners"]}
            return status if None not in found.values() else None

        status = wait_until(cadences, timeout_s=60, what="every learner registered")
        # west's learners send every 2 periods, as its file says; the syncer heard it from them
        assert {e["id"]: e["cadence"] for r in status["regions"] for e in r["learners"]} == {"L0": 1, "L1": 2, "L2": 2}
        assert status["run"] == run and status["rounds"] >= 1
        assert {r["name"]: len(r["learners"]) for r in status["regions"]} == {"east": 1, "west": 2}
        syncer_region = REGIONS["syncer"]
        site = wait_until(lambda: json.loads(runner.invoke(app, ["status", "--json"]).stdout)["site"], timeout_s=60,
                          what="the syncer to read its own site's link")  # fmt: skip
        assert site["name"] == syncer_region and max(site["up_mbps"] or 0, site["down_mbps"] or 0) > 0  # west's crossed it
        for region in status["regions"]:
            for learner in region["learners"]:
                assert {"id", "state", "step", "tokens_per_s", "up_mbps", "down_mbps"} <= set(learner)
        logs = runner.invoke(app, ["logs", "west"])
        lines = logs.output.splitlines()  # a line per line of their logs, each prefixed with its instance
        assert logs.exit_code == 0 and {line.split(" | ")[0] for line in lines} == {"L1", "L2"}, logs.output
        shell = runner.invoke(app, ["ssh", "west", "--", "true"])
        assert shell.exit_code == 2 and "no machine to ssh into" in shell.output
        (regions_file.parent / "home" / "state.sqlite3").unlink()  # labels are the truth, not the cache
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output
    # the controller may have left on its own first: with the state file gone it has no desired state to keep
    removed = json.loads(down.stdout)["removed"]
    assert sorted(set(instances_removed(json.loads(down.stdout))) - {"controller"}) == ["L0", "L1", "L2", "syncer"]
    assert removed["learner"] == ["L0", "L1", "L2"] and removed["syncer"] == ["syncer"]  # reported by kind
    assert ProcessProvider().list_run(run) == []
    again = runner.invoke(app, ["down", "--run", run, "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["removed"] == {}


@pytest.mark.slow
def test_stop_ends_a_job_early_with_its_result_and_removes_its_machines(regions_file: Path) -> None:
    run = dry_run_up(regions_file)["run"]  # a 2M-token budget: minutes of training left when we stop it
    try:
        stopped = runner.invoke(app, ["stop", "--reason", "enough for today", "--json"])
        assert stopped.exit_code == 0, stopped.output
        result = json.loads(stopped.stdout)
        summary = result["summary"]
        assert result["stopping"] and summary["reason"] == "enough for today" and summary["learners_finished"] == []
        tokens = summary["tokens"]
        assert tokens["pending"] == 0 and 0 < tokens["merged"] <= tokens["received"] <= tokens["trained"] < tokens["planned"]
        assert [i.name for i in ProcessProvider().list_run(run) if i.alive and i.name != "controller"] == []
        again = runner.invoke(app, ["stop"])  # nothing is live any more: a clear error, not a hang
        assert again.exit_code == 2 and "no run is live" in again.output
        replayed = runner.invoke(app, ["replay", "--run", run, "--json"])  # its synchronizer's tape, found by the run
        assert replayed.exit_code == 0, replayed.output
        result = json.loads(replayed.stdout)
        assert result["match"] and result["service"] and result["val_bpb"] == pytest.approx(summary["val_bpb"], abs=1e-5)
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output


@pytest.mark.slow
@pytest.mark.skipif(linkshape.available() is not None, reason=f"{linkshape.available()}")
def test_shaped_regions_measure_the_bandwidths_they_were_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    rates = {"fast": 200, "mid": 50, "slow": 12}
    regions = {
        **REGIONS,
        "training": {**REGIONS["training"], "fragments": 1},  # one ~0.6 MB update per send: long enough to time
        "syncer": "fast",
        "regions": [
            {"name": name, "provider": "process", "learners": 1, "link": {"up_mbps": rate, "down_mbps": rate}}
            for name, rate in rates.items()
        ],
    }
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump(regions))
    run = dry_run_up(path)["run"]
    try:
        seen: list[dict[str, float]] = []

        def settled() -> dict[str, float] | None:  # the EWMA's first samples on a busy 2-core machine are noisy
            status = json.loads(runner.invoke(app, ["status", "--json"]).stdout)
            measured = {r["name"]: r["learners"][0]["up_mbps"] for r in status["regions"]}
            if not all(measured.values()):
                return None
            seen.append(measured)
            within = all(0.5 * rate <= measured[name] <= 2.0 * rate for name, rate in rates.items())
            return measured if within else None

        try:
            measured = wait_until(settled, timeout_s=120, every_s=1, what="every uplink to measure within 2x of its rate")
        except TimeoutError:
            pytest.fail(f"uplinks never measured within 2x of {rates}: {seen[-3:]}")
        assert measured["fast"] > measured["mid"] > measured["slow"], measured
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output
    assert len(json.loads(down.stdout)["removed"]["network namespace"]) == 3
    assert linkshape.namespaces(f"ddctl-{run}-") == []


@pytest.mark.slow
def test_a_preempted_learner_pushes_early_and_its_replacement_rejoins(regions_file: Path) -> None:
    run = dry_run_up(regions_file)["run"]
    home = regions_file.parent / "home"
    try:
        # up returns at the first merged round, which one learner can make: west's relay host starts its relay first
        before = wait_until(lambda: _all_registered(run), timeout_s=60, what="every learner to register")
        for args, words in (
            (["west", "--for", "5"], "share this machine's network"),
            (["west", "--for", "0"], "--for must be in (0, 3600]"),
            (["nowhere", "--for", "5"], "regions with learners: east, west"),
        ):
            refused = runner.invoke(app, ["chaos", "partition", *args])
            assert refused.exit_code == 2 and words in refused.output, refused.output
        readmit = runner.invoke(app, ["syncer", "readmit", "L1", "--json"])  # the run's syncer, found by its state
        assert readmit.exit_code == 0 and json.loads(readmit.stdout)["readmitted"] is False, readmit.output
        chaos = runner.invoke(app, ["chaos", "preempt", "west", "--notice", "20", "--json"])
        assert chaos.exit_code == 0, chaos.output
        assert json.loads(chaos.stdout)["instance"] in ("L1", "L2")
        victim = json.loads(chaos.stdout)["instance"]
        summary = json.loads((home / "runs" / run / "summaries" / f"{victim}.json").read_text())
        assert summary["reason"] == "sigterm" and summary["drained"]  # the notice triggered an early push
        assert sum(summary["acked_tokens"].values()) == summary["sent_tokens"]
        rounds_at_preemption = json.loads(runner.invoke(app, ["status", "--json"]).stdout)["rounds"]
        updates = _syncer_view(run)[victim]["updates"]
        merged_before = updates.get("accepted", 0) + updates.get("late", 0)

        def replaced() -> bool:  # the controller's replacement registers as a new incarnation and gets updates accepted
            view = _syncer_view(run)[victim]
            merged = view["updates"].get("accepted", 0) + view["updates"].get("late", 0)
            return view["incarnation"] != before[victim]["incarnation"] and view["live"] and merged > merged_before

        wait_until(replaced, timeout_s=120, every_s=0.5, what=f"{victim}'s replacement to get updates merged")
        status = json.loads(runner.invoke(app, ["status", "--json"]).stdout)
        assert status["rounds"] > rounds_at_preemption  # the job kept merging
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output
    assert json.loads(down.stdout)["removed"]["controller"] == ["controller"]
    assert ProcessProvider().list_run(run) == []


def _all_registered(run: str) -> dict[str, dict] | None:
    view = _syncer_view(run)
    return view if {"L0", "L1", "L2"} <= set(view) else None


def _syncer_view(run: str) -> dict[str, dict]:
    from ddctl.control.up import admin_client

    client = admin_client(run)
    try:
        return {entry["id"]: entry for entry in client.status()["learners"]}
    finally:
        client.close()


@pytest.mark.slow
def test_the_controller_restarts_a_killed_syncer_on_its_port(regions_file: Path) -> None:
    run = dry_run_up(regions_file)["run"]
    try:
        rounds = json.loads(runner.invoke(app, ["status", "--json"]).stdout)["rounds"]
        [syncer] = [i for i in ProcessProvider().list_run(run) if i.name == "syncer"]
        os.kill(int(syncer.provider_id), signal.SIGKILL)

        def merging_again() -> Any:
            status = runner.invoke(app, ["status", "--json"])
            return status if status.exit_code == 0 and json.loads(status.stdout)["rounds"] > rounds else None

        status = wait_until(merging_again, timeout_s=120, every_s=0.5, what="the restarted syncer to merge again")
        [again] = [i for i in ProcessProvider().list_run(run) if i.name == "syncer"]
        assert again.provider_id != syncer.provider_id
        assert json.loads(status.stdout)["ledger"]["balanced"]
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output


@pytest.mark.slow
def test_up_twice_is_one_run_and_ctrl_c_during_up_leaves_nothing_behind(regions_file: Path) -> None:
    import subprocess
    import sys

    from ddctl.control.state import State

    first = dry_run_up(regions_file)
    second = dry_run_up(regions_file)  # converges: nothing to create, nothing twice
    assert second["run"] == first["run"] == "dry" and second["changed"] == []
    with State() as state:
        assert [r.id for r in state.runs() if r.state != "down"] == ["dry"]
    assert sorted(i.name for i in ProcessProvider().list_run("dry")) == ["L0", "L1", "L2", "controller", "syncer"]
    planned = json.loads(runner.invoke(app, ["up", "-f", str(regions_file), "--dry-run", "--plan", "--json"]).stdout)
    assert {i["name"]: i["action"] for i in planned["instances"]} == dict.fromkeys(("syncer", "L0", "L1", "L2"), "keep")
    assert runner.invoke(app, ["down", "--run", "dry"]).exit_code == 0
    command = [sys.executable, "-c", "from ddctl.cli.app import main; main()", "up", "-f", str(regions_file), "--dry-run"]
    interrupted = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = lambda: any(i.name == "syncer" for i in ProcessProvider().list_run("dry"))  # noqa: E731
    wait_until(started, timeout_s=60, what="up to start the syncer")
    interrupted.send_signal(signal.SIGINT)  # Ctrl-C while up waits for learners and the first round
    _, err = interrupted.communicate(timeout=60)
    assert interrupted.returncode == 130 and "interrupted" in err, err
    assert ProcessProvider().list_run("dry") == []  # up removed what it had made
    assert linkshape.namespaces("ddctl-dry-") == []
    again = runner.invoke(app, ["down", "--run", "dry", "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["removed"] == {}


def test_a_learner_over_several_vms_is_planned_as_each_of_them_and_priced_so(regions_file: Path) -> None:
    """L0 on two VMs is L0 and L0-n1, each a priced instance of the plan; the syncer stays one VM."""
    from ddctl.config.regions import Region, RegionsFile
    from ddctl.control.plan import plan, plan_summary

    shown = plan_with_west(regions_file, {"name": "west", "provider": "process", "learners": 2, "nodes": 2})
    assert [i["name"] for i in shown["instances"]] == ["syncer", "L0", "L1", "L1-n1", "L2", "L2-n1"]
    assert shown["nodes"] == {"east": 1, "west": 2} and shown["learners"] == 3
    capped = Region(name="w", provider="aws", cloud_region="us-west-2", instance_type="p4d.24xlarge", price_cap=9.5, nodes=4)
    rf = RegionsFile(syncer="s", regions=(Region(name="s", provider="process"), capped))
    planned = plan(rf, {"s": "process", "w": "aws"})
    assert [(i.name, i.learner, i.node) for i in planned if i.region == "w"] == [
        ("L1", "L1", 0), ("L1-n1", "L1", 1), ("L1-n2", "L1", 2), ("L1-n3", "L1", 3)
    ]  # fmt: skip
    assert plan_summary(rf, {"s": "process", "w": "aws"})["max_dollars_per_hour"] == 4 * 9.5
