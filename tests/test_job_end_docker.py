"""A Docker dry run to the end of a small budget: the result, the ``finished`` event, and no container left."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.providers.base import RUN_LABEL
from ddctl.providers.docker.engine import Engine, engine_unavailable
from ddctl.providers.process import ProcessProvider
from ddctl_agents.waiting import wait_until
from tests.builders import check_finished, dry_run_up, run_to_its_end, status_json

pytestmark = [pytest.mark.slow, pytest.mark.skipif(engine_unavailable() is not None, reason=f"{engine_unavailable()}")]
runner = CliRunner()
BUDGET = 150_000
RESUMED = "again"
"""The run resumed from the pulled model (``test_up_sharded.py`` has a run "resumed" of its own: ``down`` finds runs by
name on every local provider)."""


def test_a_docker_dry_run_finishes_its_budget_and_removes_every_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    regions = {
        "run": "ending",
        "syncer": "east",
        "training": {"preset": "tiny", "tokens": BUDGET, "fragments": 4, "inner_steps": 8, "max_bytes": 1 << 21},
        "regions": [{"name": name, "provider": "docker", "learners": 1} for name in ("east", "west", "south")],
    }
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump(regions))
    run = dry_run_up(path)["run"]
    try:
        status = run_to_its_end(run)
        summary = check_finished(status, ["L0", "L1", "L2"], BUDGET)
        assert summary["dollars"] == 0.0  # local regions cost nothing, and the figure says so
        with Engine() as engine:
            assert engine.containers({RUN_LABEL: run}) == [] and engine.networks({RUN_LABEL: run}) == []
        wait_until(lambda: not ProcessProvider().list_run(run), timeout_s=30, what="the run's helper processes to leave")
        screen = runner.invoke(app, ["status", "--run", run])
        assert screen.exit_code == 0 and "finished" in screen.stdout and "val bpb" in screen.stdout, screen.stdout
        listed = json.loads(runner.invoke(app, ["ls", "--json"]).stdout)["runs"]
        assert [(r["run"], r["state"], r["instances_up"]) for r in listed] == [(run, "finished", 0)]
        pulled = _pull_reproduces_the_final_val_bpb(run, tmp_path / "model", summary)
        # the learners trained in their VMs; fresh ones here make their updates again, from the syncer's disk's tape
        replayed = runner.invoke(app, ["replay", "--run", run, "--json"])
        assert replayed.exit_code == 0, replayed.output
        assert json.loads(replayed.stdout)["recorded_sha256"] == json.loads(replayed.stdout)["params_sha256"]
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0 and json.loads(down.stdout)["removed"] == {}, down.output
    _a_new_run_resumes_from_it(path, tmp_path / "model", pulled)


def _pull_reproduces_the_final_val_bpb(run: str, out: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The final checkpoint, from the syncer's disk after its VM is gone: the summary's val_bpb, bit for bit."""
    from safetensors.torch import load_file

    from ddctl_agents.jsonable import from_json
    from ddctl_agents.train.assembly import Assembly
    from ddctl_agents.train.job import JobConfig

    result = runner.invoke(app, ["pull", run, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    pulled = json.loads(result.stdout)
    manifest = json.loads((out / "manifest.json").read_text())
    assert pulled["rounds"] == summary["rounds"] and round(manifest["val_bpb"], 5) == summary["val_bpb"]
    assert summary["checkpoint"].endswith(pulled["checkpoint"])
    assembly = Assembly.build(from_json(JobConfig, manifest["job"]))
    assert assembly.evaluate(load_file(str(out / "model.safetensors"))) == manifest["val_bpb"]
    return dict(manifest)


def _a_new_run_resumes_from_it(regions: Path, model: Path, manifest: dict[str, Any]) -> None:
    """A new run (twice the budget) from the pulled checkpoint: its books and its learners' loss go on from there."""
    raw = yaml.safe_load(regions.read_text())
    raw["run"], raw["training"]["tokens"] = RESUMED, 2 * BUDGET
    regions.write_text(yaml.safe_dump(raw))
    fresh_loss = math.log(256)  # nats per byte of a model that knows nothing
    up = runner.invoke(app, ["up", "-f", str(regions), "--dry-run", "--resume-from", str(model), "--json"])
    assert up.exit_code == 0, up.output
    try:
        assert json.loads(up.stdout)["resumed_from"]["rounds"] == manifest["rounds"]

        def learners_report() -> dict[str, Any] | None:
            status = status_json()
            losses = [e["loss"] for r in status["regions"] for e in r["learners"] if e.get("loss") is not None]
            return status if len(losses) == 3 else None

        status = wait_until(learners_report, timeout_s=120, every_s=1.0, what="the resumed learners' first losses")
        learners = [e for r in status["regions"] for e in r["learners"]]
        assert all(e["step"] >= manifest["steps"][e["id"]] for e in learners)  # their schedules go on
        assert all(e["loss"] < 0.8 * fresh_loss for e in learners), learners  # so does the loss curve
        assert status["tokens"]["merged"] >= manifest["tokens"]["merged"]  # and the books
    finally:
        down = runner.invoke(app, ["down", "--run", RESUMED, "--json"])
    assert down.exit_code == 0, down.output
