"""What a learner is told to run: one learner over a region's ranks is ``--gpus N`` on its command line."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from ddctl.config.regions import Region
from ddctl.control.rundir import RunDir
from ddctl.control.specs import learner_spec
from ddctl.providers.base import RegionInfo

INFO = RegionInfo(region="east", provider="process", python="/usr/bin/python3", remote=False, syncer_host="127.0.0.1")


@pytest.fixture(autouse=True)
def job_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run directory with the job's secret, which ``learner_spec`` derives the learner's token from."""
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    RunDir("r").job.mkdir(parents=True)
    (RunDir("r").job / "secret").write_text(secrets.token_hex(32) + "\n")


@pytest.mark.parametrize(("fields", "flag"), [({"gpus": 2}, ["--gpus", "2"]), ({"gpus": 1}, []), ({}, [])])
def test_a_learner_over_several_ranks_is_told_how_many(fields: dict, flag: list[str]) -> None:
    region = Region(name="east", provider="process", **fields)
    argv = list(learner_spec("r", INFO, region, "L0", 9000).argv)
    found = argv[argv.index("--gpus") : argv.index("--gpus") + 2] if "--gpus" in argv else []
    assert found == flag and argv.count("--gpus") == len(flag) // 2


def test_the_default_ranks_are_the_vms_accelerators() -> None:
    region = Region(name="east", provider="process", accelerator="nvidia-l4", accelerator_count=4)
    argv = learner_spec("r", INFO, region, "L0", 9000).argv
    assert argv[-2:] == ("--gpus", "4")
