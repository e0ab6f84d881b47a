"""A Docker dry run to the end of a small budget: the result, the ``finished`` event, and no container left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.providers.base import RUN_LABEL
from ddctl.providers.docker.engine import Engine, engine_unavailable
from ddctl.providers.process import ProcessProvider
from ddctl_agents.waiting import wait_until
from tests.builders import check_finished, dry_run_up, run_to_its_end

pytestmark = [pytest.mark.slow, pytest.mark.skipif(engine_unavailable() is not None, reason=f"{engine_unavailable()}")]
runner = CliRunner()
BUDGET = 150_000


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
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0 and json.loads(down.stdout)["removed"] == {}, down.output
