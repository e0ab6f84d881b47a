"""Your model and your data, end to end: a Hugging Face model of yours trains on text tokenised by ``ddctl data
prepare`` in a dry run to its end (its source shipped with the job; Docker VMs read the shards through a read-only
bind, local processes at their paths), and what cannot work is refused at ``up --plan``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from tests.builders import check_finished, dry_run_up, run_to_its_end
from tests.test_data_prepare import prose, tokenizer_file  # noqa: F401 - the fixture

runner = CliRunner()
BUDGET = 40_000


@pytest.fixture
def shards(tmp_path: Path, tokenizer_file: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    text = tmp_path / "text"
    text.mkdir()
    for seed in range(4):
        (text / f"part{seed}.txt").write_text(prose(100 + seed, 20_000))
    out = tmp_path / "shards"
    prepared = runner.invoke(
        app, ["data", "prepare", "--tokenizer", str(tokenizer_file), "--out", str(out), "--shard-tokens", "20000", str(text)]
    )
    assert prepared.exit_code == 0, prepared.output
    return out


def regions(tmp_path: Path, training: dict, provider: str = "docker") -> Path:
    raw = {
        "run": "mine",
        "syncer": "east",
        "training": {"preset": "tiny", "tokens": BUDGET, "fragments": 2, "inner_steps": 8, "batch_size": 4, **training},
        "regions": [{"name": name, "provider": provider, "learners": 1} for name in ("east", "west")],
    }
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
def test_a_dry_run_trains_on_prepared_token_shards_to_its_end(tmp_path: Path, shards: Path) -> None:
    model = f"{Path(__file__).parents[1] / 'docs' / 'examples' / 'hf_model.py'}:build"
    path = regions(tmp_path, {"token_data": ["shards"], "vocab_size": 320, "model": model})  # data: relative to the file
    run = dry_run_up(path)["run"]
    try:
        summary = check_finished(run_to_its_end(run), ["L0", "L1"], BUDGET)
        untrained = math.log2(320) / 2.0  # at least 2 bytes per token here: a uniform guess costs at most this per byte
        assert 0 < summary["val_bpb"] < untrained, summary
        pulled = runner.invoke(app, ["pull", run, "--out", str(tmp_path / "model"), "--json"])
        assert pulled.exit_code == 0, pulled.output
        assert json.loads((tmp_path / "model" / "config.json").read_text())["vocab_size"] == 320
        assert (tmp_path / "model" / "model" / "hf_model.py").exists()  # the model's source beside its weights
        manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
        assert manifest["job"]["inner"]["model"] == "hf_model:build"  # as the agents imported it, from the job
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output


def test_data_the_model_or_the_regions_cannot_use_is_refused_at_plan_time(tmp_path: Path, shards: Path) -> None:
    wrong = runner.invoke(app, ["up", "-f", str(regions(tmp_path, {"token_data": [str(shards)]})), "--plan", "--dry-run"])
    assert wrong.exit_code == 2 and "the model's vocabulary is 256 but training.token_data's is 320" in wrong.output
    assert "set training.vocab_size: 320" in wrong.output
    cloud = regions(tmp_path, {"token_data": [str(shards)], "vocab_size": 320}, provider="process")
    raw = yaml.safe_load(cloud.read_text())
    raw["regions"][1] |= {"provider": "aws", "cloud_region": "us-east-1", "instance_type": "g5.xlarge"}
    raw["syncer"] = "west"
    cloud.write_text(yaml.safe_dump(raw))
    far = runner.invoke(app, ["up", "-f", str(cloud), "--plan"])
    assert far.exit_code == 2 and f"training data {shards} is on this machine, which aws VMs cannot read" in far.output
    assert "object storage" in far.output
    broken = tmp_path / "broken.py"
    broken.write_text("def build(config):\n    return 42\n")
    mine = runner.invoke(app, ["up", "-f", str(regions(tmp_path, {"model": "broken.py:build"})), "--plan", "--dry-run"])
    assert mine.exit_code == 2 and "rule 'factory'" in mine.output and "not a torch.nn.Module" in mine.output, mine.output
    assert not (tmp_path / "home" / "runs").exists()  # nothing was made
