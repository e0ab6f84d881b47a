"""The controller's decisions: what to restart, in which order, on which port."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ddctl.controller import same_port, to_replace
from ddctl.state import InstanceRecord


def record(name: str, role: str, summary: Path | None = None) -> InstanceRecord:
    detail = {"argv": ["x"], "log": "l"} | ({"summary": str(summary)} if summary else {})
    return InstanceRecord("r", name, "eu", "process", role, "running", "1", time.time(), detail)


def test_gone_learners_are_replaced_unless_they_finished_and_the_syncer_comes_first(tmp_path: Path) -> None:
    done, preempted = tmp_path / "L0.json", tmp_path / "L1.json"
    done.write_text(json.dumps({"reason": "finished"}))
    preempted.write_text(json.dumps({"reason": "sigterm"}))
    desired = [
        record("L0", "learner", done),
        record("L1", "learner", preempted),
        record("L2", "learner", tmp_path / "never-written.json"),  # killed: no summary
        record("L3", "learner", tmp_path / "L3.json"),
        record("syncer", "syncer"),
        record("controller", "controller"),
    ]
    chosen = [r.name for r in to_replace(desired, alive={"L3", "controller"})]
    assert chosen == ["syncer", "L1", "L2"]


def test_a_restarted_syncer_binds_the_port_its_learners_know(tmp_path: Path) -> None:
    port = tmp_path / "syncer.port"
    port.write_text("43123\n")
    argv = ["python", "-m", "ddctl_agents.service", "--bind", "0.0.0.0:0", "--job-dir", "j"]
    assert same_port(argv, port) == ["python", "-m", "ddctl_agents.service", "--bind", "0.0.0.0:43123", "--job-dir", "j"]
    assert same_port(argv, tmp_path / "missing") == argv
