"""Three small promises of the CLI, each held by exit code and message.

- tau (``--overlap``, ``training.overlap``) may not exceed H (``--inner-steps``): ALGORITHM.md §3;
- ``ddctl down --run NAME`` for a name with no record and no labelled machine is an error that lists the runs,
  while a known run that is already down stays a no-op (exit 0);
- a corrupt checkpoint is bad input data (exit 3), not bad usage (exit 2); see also ``test_pull.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.cli.errors import EXIT_DATA, EXIT_OK, EXIT_USAGE, exit_code_for
from ddctl.config.job import build_job
from ddctl.config.regions import load_regions
from ddctl.control.rundir import RunDir
from ddctl.control.state import State
from ddctl.errors import RegionsError
from ddctl.providers.base import InstanceSpec
from ddctl.providers.fake import FakeProvider
from ddctl_agents.core.config import SyncerConfig
from ddctl_agents.core.quorum import QuorumConfig
from ddctl_agents.errors import ConfigError

runner = CliRunner()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# -- tau <= H ----------------------------------------------------------------------------------------


def test_overlap_up_to_h_is_accepted_and_beyond_it_refused_naming_the_range() -> None:
    assert SyncerConfig(quorum=QuorumConfig(overlap=8), inner_steps=8).quorum.overlap == 8
    assert SyncerConfig(quorum=QuorumConfig(overlap=0), inner_steps=1).quorum.overlap == 0
    with pytest.raises(ConfigError, match=r"overlap \(tau\) must be in 0\.\.8 .*inner_steps.*got 9"):
        SyncerConfig(quorum=QuorumConfig(overlap=9), inner_steps=8)
    with pytest.raises(ConfigError, match=r"overlap \(tau\) must be in 0\.\.4 .*got 10"):
        build_job({"inner_steps": 4, "overlap": 10})
    assert build_job({"inner_steps": 4, "overlap": 4}).syncer.quorum.overlap == 4


def test_ddctl_train_refuses_overlap_beyond_inner_steps_before_training() -> None:
    result = runner.invoke(app, ["train", "--tokens", "1000", "--learners", "2", "--inner-steps", "4", "--overlap", "5"])
    assert result.exit_code == EXIT_USAGE, result.output
    assert "overlap (tau) must be in 0..4" in result.output and "got 5" in result.output


def test_regions_yaml_overlap_beyond_inner_steps_names_the_key_and_the_range(tmp_path: Path) -> None:
    path = tmp_path / "regions.yaml"
    for training, key in (({"overlap": 30}, "training.overlap"), ({"inner_steps": 4, "overlap": 10}, "training")):
        body = {"run": "r", "syncer": "a", "training": {"preset": "tiny", **training},
                "regions": [{"name": "a", "provider": "process", "learners": 2}]}  # fmt: skip
        path.write_text(yaml.safe_dump(body))
        with pytest.raises(RegionsError) as caught:
            load_regions(path)
        h = training.get("inner_steps", 24)
        assert caught.value.key == key and f"overlap (tau) must be in 0..{h}" in str(caught.value), caught.value
        assert str(path) in str(caught.value) and exit_code_for(caught.value) == EXIT_USAGE


# -- down --run NAME -----------------------------------------------------------------------------------


def test_down_is_idempotent_for_a_known_run_and_a_name_with_nothing_left(home: Path) -> None:
    """A script's down may run again after the state file is gone (labels are the truth): nothing to remove, exit 0."""
    with State() as state:
        state.create_run("real", "regions.yaml", str(RunDir("real").job), {})
        state.set_run_state("real", "down")
    for name in ("real", "real", "gone"):
        again = runner.invoke(app, ["down", "--run", name, "--json"])
        assert again.exit_code == EXIT_OK and json.loads(again.stdout) == {"run": name, "removed": {}}, again.output


def test_down_of_a_name_with_no_record_still_removes_its_labelled_machines(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state file is a cache: a lost record does not hide a run's machines from down."""
    fake = FakeProvider()
    spec = InstanceSpec(run="lost", name="L0", region="eu", role="learner", argv=("agent",), log=tmp_path / "L0")
    fake.create(spec)
    monkeypatch.setattr("ddctl.control.down.searched", lambda state, run: [fake])
    out = runner.invoke(app, ["down", "--run", "lost", "--json"])
    assert out.exit_code == EXIT_OK and json.loads(out.stdout) == {"run": "lost", "removed": {"learner": ["L0"]}}
    assert fake.list_run("lost") == []


# -- a corrupt checkpoint: exit 3 ------------------------------------------------------------------------


def test_a_checkpoint_error_is_bad_input_data() -> None:
    from ddctl_agents import entrypoint
    from ddctl_agents.errors import CheckpointError

    damaged = CheckpointError("x/model.safetensors: its size or sha256 does not match")
    assert exit_code_for(damaged) == EXIT_DATA == entrypoint.exit_code_for(damaged)  # the agents' table agrees
    assert exit_code_for(ConfigError("overlap")) == EXIT_USAGE
