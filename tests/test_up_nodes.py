"""A learner over several machines, end to end: ``nodes: 2`` makes two VMs that are one learner under torchrun's
c10d rendezvous at the first one's private address; losing either replaces both, and the learner rejoins.

Docker VMs where an engine answers (each its own network stack and address on its region's network), else
local processes (the dry run's fallback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddctl import providers
from ddctl.cli.app import app
from ddctl.control.state import State
from ddctl_agents.waiting import wait_until
from tests.builders import dry_run_up, instances_removed, regions_at, status_json

pytestmark = pytest.mark.slow
runner = CliRunner()
REGIONS = {
    "run": "spread",
    "syncer": "east",
    "training": {"preset": "tiny", "tokens": 2_000_000, "fragments": 2, "inner_steps": 8, "batch_size": 4},
    "regions": [
        {"name": "east", "provider": "docker", "learners": 1},
        {"name": "west", "provider": "docker", "learners": 1, "gpus": 1, "nodes": 2},
    ],
}


@pytest.fixture
def regions_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return regions_at(tmp_path, monkeypatch, REGIONS)


def _learner(status: dict, name: str) -> dict:
    return next(entry for region in status["regions"] for entry in region["learners"] if entry["id"] == name)


def test_a_learner_over_two_machines_trains_as_one_and_is_replaced_as_one(regions_file: Path) -> None:
    started = dry_run_up(regions_file)
    run, vms = started["run"], providers.get(started["provider"])
    try:
        listed = {i.name: i for i in vms.list_run(run)}
        assert {"L0", "L1", "L1-n1", "syncer"} <= set(listed)
        assert listed["L1"].private_address != listed["L1-n1"].private_address or started["provider"] == "process"

        def both_ranks_train() -> dict | None:
            entry = _learner(status_json(), "L1")
            return entry if entry["state"] == "training" and entry["step"] > 0 else None

        first = wait_until(both_ranks_train, timeout_s=120, every_s=0.5, what="L1's two machines to train as one")
        assert first["devices"] == 2  # one learner, its ranks over both machines
        assert [e["id"] for r in status_json()["regions"] for e in r["learners"]] == ["L0", "L1"]  # one row per learner
        incarnation = first["incarnation"]
        vms.terminate(listed["L1-n1"], grace_s=0.0)  # its second machine is lost, without notice

        def rejoined() -> dict | None:
            entry = _learner(status_json(), "L1")
            return entry if entry["incarnation"] != incarnation and entry["state"] == "training" else None

        again = wait_until(rejoined, timeout_s=180, every_s=0.5, what="L1 to come back on two new machines")
        assert again["devices"] == 2
        now = {i.name: i for i in vms.list_run(run)}
        assert {now["L1"].provider_id, now["L1-n1"].provider_id}.isdisjoint(
            {listed["L1"].provider_id, listed["L1-n1"].provider_id}
        )  # both were replaced: the survivor did not wait out a collective timeout
        assert now["L0"].provider_id == listed["L0"].provider_id  # the other learner was left alone
        with State(regions_file.parent / "home" / "state.sqlite3") as state:
            lost = [e for e in state.events(run, 500) if e.get("kind") == "terminate" and e.get("instance") == "L1"]
        assert lost and "L1 lost L1-n1; its VMs are replaced as one" in lost[0]["reason"]
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output
    assert {"L0", "L1", "L1-n1", "syncer"} <= set(instances_removed(json.loads(down.stdout)))
    assert vms.list_run(run) == []
