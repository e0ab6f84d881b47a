from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders import small_run
from ddctl.config.train import ClusterConfig, Outage
from ddctl.errors import ReplayDivergence
from ddctl.local.replay import replay_tape
from ddctl.local.training import train_decoupled
from ddctl_agents.core.tape import TapeError

HETERO = ClusterConfig(speeds=(1.0, 0.6, 1.3), outages=(Outage(learner=2, at=6.0, duration=5.0),))


@pytest.fixture(scope="module")
def taped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("tape") / "run.jsonl"
    return path, train_decoupled(small_run(tokens=40_000, learners=3, cluster=HETERO), path)


@pytest.mark.slow
def test_replay_reproduces_the_parameters_bit_for_bit(taped: tuple[Path, dict]) -> None:
    path, run = taped
    replayed = replay_tape(path)
    assert replayed["match"] and replayed["params_sha256"] == run["params_sha256"]
    assert replayed["val_bpb"] == run["val_bpb"]
    assert replayed["rounds"] == run["rounds"]


def test_tape_has_one_record_per_decision_with_vector_clocks(taped: tuple[Path, dict]) -> None:
    path, run = taped
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[0]["type"] == "config" and records[-1]["type"] == "end"
    rounds = [r for r in records if r["type"] == "round"]
    assert len(rounds) == run["rounds"]
    assert all(r["reason"] and r["admitted"] for r in rounds)
    assert {r["type"] for r in records} >= {"join", "update", "round", "failure", "leave"}
    clocks = [r["vclock"]["syncer"] for r in records if "vclock" in r]
    assert clocks == sorted(clocks)  # the syncer's own entry only grows along the tape


@pytest.mark.slow
def test_a_tampered_tape_is_caught(taped: tuple[Path, dict], tmp_path: Path) -> None:
    path, _ = taped
    lines = path.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if '"type":"round"' in line)
    record = json.loads(lines[i])
    record["admitted"] = record["admitted"][:1] + [{"learner": "L9", "late": False, "c_steps": 1, "c_tokens": 1, "weight": 1.0}]
    lines[i] = json.dumps(record)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ReplayDivergence, match="line"):
        replay_tape(bad)


def test_unreadable_tapes_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TapeError, match="cannot open tape"):
        replay_tape(tmp_path / "missing.jsonl")
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n")
    with pytest.raises(TapeError, match="junk.jsonl:1: not a JSON record"):
        replay_tape(junk)
    headless = tmp_path / "headless.jsonl"
    headless.write_text('{"type": "round"}\n')
    with pytest.raises(TapeError, match="starts with a config record"):
        replay_tape(headless)


def test_a_tape_is_never_overwritten(taped: tuple[Path, dict]) -> None:
    path, _ = taped
    with pytest.raises(FileExistsError, match="already exists"):
        train_decoupled(small_run(tokens=1000), path)
