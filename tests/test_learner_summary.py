"""The learner's exit summary on disk (``agent/summary.py``): replaced whole, and one history line per life."""

from __future__ import annotations

import json
from pathlib import Path

from ddctl_agents.agent.summary import write


def test_each_life_replaces_the_summary_and_adds_a_line_to_its_history(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "L0.summary.json"  # its folder is made
    write(path, {"incarnation": 1, "reason": "preempted"})
    write(path, {"incarnation": 2, "reason": "finished"})
    assert json.loads(path.read_text()) == {"incarnation": 2, "reason": "finished"}
    lines = path.with_suffix(".history.jsonl").read_text().splitlines()
    assert [json.loads(line)["incarnation"] for line in lines] == [1, 2]
    assert not path.with_suffix(".tmp").exists()
