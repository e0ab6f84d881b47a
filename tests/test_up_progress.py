"""``ddctl up`` is never silent: its stages as plain lines off a terminal, a spinner on one; and what it says is true."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ddctl import providers
from ddctl.cli.app import app
from ddctl.cli.output import progress_lines
from ddctl.config.regions import PROVIDERS, load_regions
from ddctl.control import up as up_module
from ddctl.control.state import State
from ddctl.errors import DdctlError
from ddctl.providers.fake import FakeProvider

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[")
runner = CliRunner()
REGIONS = {
    "run": "quiet",
    "syncer": "east",
    "training": {"preset": "tiny", "tokens": 200_000, "fragments": 4, "inner_steps": 8},
    "regions": [{"name": "east", "provider": "process"}, {"name": "west", "provider": "process", "learners": 2}],
}
STAGES = [
    "bootstrapping the process regions east, west",
    "made the job directory ",
    "starting syncer",
    "syncer deployed in east",
    "starting L0, L1 in parallel",  # east's learner, and L1, which hosts west's relay
    "starting L2 (their regions' relays are up)",  # pointed at L1's
    "waiting for the first merged round",
    "starting the controller",
]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def write_regions(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def fake_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeProvider:
    """``up`` against the in-memory provider, its first round merged at once: every stage, no process."""
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    fake = FakeProvider()
    monkeypatch.setattr(providers, "get", lambda kind: fake)
    monkeypatch.setattr(up_module, "wait_first_round", lambda run, timeout_s, exited: {"rounds": 1, "live": ["L0", "L1", "L2"]})
    return fake


def test_plain_lines_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with progress_lines("bringing r up") as say:
        say("starting syncer")
        say("L0 deployed in east")
    assert err.getvalue() == "starting syncer\nL0 deployed in east\n"


def test_a_spinner_and_timed_lines_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    with progress_lines("bringing r up") as say:
        say("starting syncer")
    text = err.getvalue()
    assert ANSI.search(text) and "\x1b[?25l" in text  # drawn in place, the cursor hidden while it spins
    assert re.search(r"\d+\.\ds .*starting syncer", ANSI.sub("", text))
    assert "\x1b[?25h" in text  # and shown again once it stops


def test_up_reports_every_stage_in_order(tmp_path: Path, fake_up: FakeProvider) -> None:
    said: list[str] = []
    with State() as state:
        result = up_module.up(load_regions(write_regions(tmp_path, REGIONS)), state, dry_run=True, say=said.append)
    assert result["rounds"] == 1
    positions = [next(i for i, line in enumerate(said) if line.startswith(stage)) for stage in STAGES]
    assert positions == sorted(positions), said
    assert {line for line in said if "deployed" in line} == {
        "syncer deployed in east",
        "L0 deployed in east",
        "L1 deployed in west",
        "L2 deployed in west",
    }


def test_up_converging_a_live_run_says_nothing_is_missing(tmp_path: Path, fake_up: FakeProvider) -> None:
    rf = load_regions(write_regions(tmp_path, REGIONS))
    with State() as state:
        up_module.up(rf, state, dry_run=True, say=lambda _: None)
        said: list[str] = []
        up_module.up(rf, state, dry_run=True, say=said.append)
    assert "every instance already runs" in said and not any(line.startswith("made the job") for line in said)


def test_converging_a_live_run_never_starts_again_a_learner_that_finished(tmp_path: Path, fake_up: FakeProvider) -> None:
    rf = load_regions(write_regions(tmp_path, REGIONS))
    with State() as state:
        up_module.up(rf, state, dry_run=True, say=lambda _: None)
        [l1] = [r for r in state.instances("quiet") if r.name == "L1"]
        state.put_instance(replace(l1, state="finished"))  # what the controller records when L1 trained its share
        fake_up.end("quiet", "L1")
        fake_up.end("quiet", "L2")  # L2 did not finish: it is started again
        result = up_module.up(rf, state, dry_run=True, say=lambda _: None)
    started = {c["instance"] for c in result["changed"] if c["action"] in ("create", "replace")}
    assert started == {"L2"}, result["changed"]
    assert {i.name for i in fake_up.list_run("quiet") if i.alive} == {"controller", "syncer", "L0", "L2"}
    planned = runner.invoke(app, ["up", "--dry-run", "--plan", "--json", "-f", str(write_regions(tmp_path, REGIONS))])
    assert planned.exit_code == 0, planned.output
    actions = {i["name"]: (i["action"], i["reason"]) for i in json.loads(planned.stdout)["instances"]}
    assert actions["L1"] == ("done", "finished its work; not started again") and actions["L0"] == ("keep", "running")


def test_a_plan_with_no_state_file_makes_none(tmp_path: Path, fake_up: FakeProvider) -> None:
    planned = runner.invoke(app, ["up", "--dry-run", "--plan", "--json", "-f", str(write_regions(tmp_path, REGIONS))])
    assert planned.exit_code == 0, planned.output
    assert {i["action"] for i in json.loads(planned.stdout)["instances"]} == {"create"}
    assert not State.default_path().exists()


def test_the_cli_prints_the_stages_plainly_off_a_terminal(tmp_path: Path, fake_up: FakeProvider) -> None:
    result = runner.invoke(app, ["up", "--dry-run", "-f", str(write_regions(tmp_path, REGIONS))])
    assert result.exit_code == 0, result.output
    assert not ANSI.search(result.stderr)
    lines = result.stderr.splitlines()
    assert all(any(line.startswith(stage) for line in lines) for stage in STAGES), result.stderr
    assert result.stdout.startswith("run quiet is training")


def test_an_all_docker_file_hears_nothing_about_clouds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docker = {**REGIONS, "regions": [{"name": "east", "provider": "docker"}, {"name": "west", "provider": "docker"}]}
    rf = load_regions(write_regions(tmp_path, docker))
    said: list[str] = []
    assert set(up_module.kinds_for(rf, False, said.append).values()) == {"docker"} and said == []
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    assert set(up_module.kinds_for(rf, True, said.append).values()) == {"process"}
    assert len(said) == 1 and said[0].startswith("no Docker engine") and "processes instead" in said[0]
    assert not re.search(r"aws|gcp|cloud|not built", " ".join(said))


def test_a_cloud_learner_with_a_syncer_on_this_machine_is_refused_before_anything_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    cloudy = {
        **REGIONS,
        "syncer": "here",
        "regions": [{"name": "here", "provider": "process"}, {"name": "east", "provider": "gcp", "cloud_region": "us-east1"}],
    }
    result = runner.invoke(app, ["up", "-f", str(write_regions(tmp_path, cloudy))])
    assert result.exit_code == 2
    assert "'here' is a process region on this machine, which gcp VMs cannot reach" in result.stderr
    assert "put the syncer in a cloud region" in result.stderr
    assert not (tmp_path / "home" / "runs").exists()
    with pytest.raises(DdctlError, match="'azure' is not built yet"):
        providers.require_built(["docker", "azure"])
    providers.require_built(["docker", "process", "aws", "gcp"])


def test_the_example_regions_file_comments_are_true() -> None:
    text = (ROOT / "regions.yaml").read_text()
    rf = load_regions(ROOT / "regions.yaml")
    header = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    used = {r.provider for r in rf.regions}
    assert used == {"docker"} and "Docker VMs" in header
    assert "local processes where no engine runs" in header  # processes only as the fallback, as dry_run_kind does
    listed = re.search(r"provider: \w+ +# ([a-z |]+)", text)
    assert listed and {p.strip() for p in listed[1].split("|")} == set(PROVIDERS)
    assert set(providers.PLANNED) == set(PROVIDERS) - set(providers.KINDS)  # "not built yet" names exactly these
    if any(r.link and r.link.latency_ms for r in rf.regions):
        assert "latency_ms is checked but not emulated" in header
