"""The controller's decisions: what to restart, in which order, on which port."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ddctl.control.controller import finished, same_port, to_replace
from ddctl.control.state import InstanceRecord


def record(name: str, role: str, state: str = "running") -> InstanceRecord:
    return InstanceRecord("r", name, "eu", "process", role, state, "1", time.time(), {"log": "l"})


def test_gone_learners_are_replaced_unless_they_finished_and_the_syncer_comes_first() -> None:
    desired = [
        record("L0", "learner"),  # its summary says finished (this pass)
        record("L1", "learner"),  # preempted
        record("L2", "learner"),  # killed: no summary
        record("L3", "learner"),  # alive
        record("L4", "learner", state="finished"),  # finished in an earlier pass: its VM is gone
        record("syncer", "syncer"),
        record("controller", "controller"),
    ]
    chosen = [r.name for r in to_replace(desired, alive={"L3", "controller"}, done={"L0"})]
    assert chosen == ["syncer", "L1", "L2"]


def test_only_a_summary_that_says_finished_means_finished() -> None:
    assert finished(json.dumps({"reason": "finished"}).encode())
    assert not finished(json.dumps({"reason": "preemption_notice"}).encode())
    assert not finished(None)  # killed before it could write one
    assert not finished(b"{trunc")  # torn by a kill mid-write


def test_a_restarted_syncer_binds_the_port_its_learners_know(tmp_path: Path) -> None:
    port = tmp_path / "syncer.port"
    port.write_text("43123\n")
    argv = ["python", "-m", "ddctl_agents.service", "--bind", "0.0.0.0:0", "--job-dir", "j"]
    assert same_port(argv, port) == ["python", "-m", "ddctl_agents.service", "--bind", "0.0.0.0:43123", "--job-dir", "j"]
    assert same_port(argv, tmp_path / "missing") == argv
