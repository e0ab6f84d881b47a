"""``ddctl pull``: a checkpoint comes here checked whole, reloads into the model with the syncer's val_bpb bit for bit,
and a bad source or destination changes nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.config.train import TrainConfig
from ddctl_agents.jsonable import from_json
from ddctl_agents.service.checkpoints import CheckpointPolicy
from ddctl_agents.service.runtime import SyncerRuntime
from ddctl_agents.service.settings import ServiceSettings
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.checkpoint import MANIFEST, MODEL
from tests.builders import small_run
from tests.test_service_recovery import frame_for, settle
from tests.test_storage import gcs, gcs_server, moto_endpoint, s3, store  # noqa: F401 - fixtures

runner = CliRunner()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A syncer's checkpoints folder after three merged rounds, a checkpoint after each."""
    state = tmp_path_factory.mktemp("syncer")
    assembly = Assembly.build(small_run(learners=2))
    settings = ServiceSettings(state_dir=state, snapshot_every_s=3600, checkpoints=CheckpointPolicy(every_s=0, keep_last=3))

    async def train() -> None:
        rt = SyncerRuntime(assembly, settings)
        await rt.start()
        await rt.register("L0", 1, "a")
        await rt.register("L1", 1, "b")
        for r in range(3):
            for learner in ("L0", "L1"):
                await rt.push(learner, frame_for(rt, learner, r, 0.02 * (r + 1)))
            await settle(rt, r + 1)
            await rt.checkpoint()
        await rt.stop()

    asyncio.run(train())
    return state / "checkpoints"


def pull(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["pull", *args])
    return result.exit_code, result.output


def test_pull_writes_the_newest_checkpoint_and_it_reloads_with_the_syncers_val_bpb_bit_for_bit(
    folder: Path, tmp_path: Path
) -> None:
    code, output = pull("--from", str(folder), "--out", str(tmp_path / "model"), "--json")
    assert code == 0, output
    result = json.loads(output)
    assert result["checkpoint"] == "ckpt-000003" and result["rounds"] == 3
    assert result["files"] == ["config.json", MANIFEST, MODEL, "outer.safetensors"]
    manifest = json.loads((tmp_path / "model" / MANIFEST).read_text())
    assert (tmp_path / "model" / MODEL).read_bytes() == (folder / "ckpt-000003" / MODEL).read_bytes()
    from safetensors.torch import load_file

    assembly = Assembly.build(from_json(TrainConfig, manifest["job"]))  # the job the checkpoint names, rebuilt here
    reloaded = assembly.evaluate(load_file(str(tmp_path / "model" / MODEL)))
    assert reloaded == manifest["val_bpb"] == result["val_bpb"]  # not close: equal
    assert json.loads((tmp_path / "model" / "config.json").read_text()) == manifest["model"]


def test_pull_lists_and_picks_a_chosen_checkpoint_and_names_the_ones_there_are(folder: Path, tmp_path: Path) -> None:
    code, output = pull("--from", str(folder), "--list", "--json")
    assert code == 0 and [e["name"] for e in json.loads(output)["checkpoints"]] == ["ckpt-000001", "ckpt-000002", "ckpt-000003"]
    assert [e["rounds"] for e in json.loads(output)["checkpoints"]] == [1, 2, 3]
    code, output = pull("--from", str(folder), "--checkpoint", "ckpt-000001", "--out", str(tmp_path / "one"), "--json")
    assert code == 0 and json.loads(output)["rounds"] == 1
    code, output = pull("--from", str(folder / "ckpt-000002"), "--out", str(tmp_path / "two"), "--json")  # one checkpoint
    assert code == 0 and json.loads(output)["rounds"] == 2
    code, output = pull("--from", str(folder), "--checkpoint", "ckpt-000009", "--out", str(tmp_path / "nine"))
    assert code == 2 and "has no checkpoint 'ckpt-000009'; it has ckpt-000001, ckpt-000002, ckpt-000003" in output
    assert not (tmp_path / "nine").exists()


def test_a_damaged_checkpoint_or_a_used_directory_is_refused_and_nothing_is_written(folder: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    model = copy / "ckpt-000003" / MODEL
    model.write_bytes(model.read_bytes()[:-8])  # a partial copy
    code, output = pull("--from", str(copy), "--out", str(tmp_path / "out"))
    assert code == 3 and "model.safetensors: its size or sha256 does not match the manifest's" in output, output
    assert f"{copy}/ckpt-000003" in output  # names the file: bad input data (3), not bad usage (2)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    used = tmp_path / "used"
    used.mkdir()
    (used / "mine.txt").write_text("keep me")
    code, output = pull("--from", str(folder), "--out", str(used))
    assert code == 2 and "exists and is not empty" in output and sorted(p.name for p in used.iterdir()) == ["mine.txt"]
    code, output = pull("--from", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x"))
    assert code == 2 and "no such directory" in output
    code, output = pull("--from", "s3://", "--out", str(tmp_path / "x"))
    assert code == 2 and "s3://BUCKET/KEY" in output


def test_a_corrupt_manifest_is_bad_input_data_naming_the_file(folder: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    (copy / "ckpt-000003" / MANIFEST).write_bytes(b"{not json")
    for source in (copy, copy / "ckpt-000003"):  # through the folder's index, and the checkpoint alone
        code, output = pull("--from", str(source), "--out", str(tmp_path / "out"))
        said = "".join(output.split())  # the message names the checkpoint, the file and what is wrong with it
        assert code == 3 and f"{copy / 'ckpt-000003'}:{MANIFEST}:thedocument:InvalidJSON" in said, output
        assert not (tmp_path / "out").exists()


def test_resuming_with_another_model_is_a_settings_error_naming_what_differs(folder: Path) -> None:
    from ddctl.control.pull import resume_point
    from ddctl.errors import DdctlError
    from ddctl_agents.train.checkpoint import CheckpointError
    from ddctl_agents.train.config import InnerConfig

    with pytest.raises(DdctlError, match="its model differs from this job.s in d_model, n_head, n_layer") as caught:
        resume_point(str(folder), InnerConfig(preset="micro"))
    assert not isinstance(caught.value, CheckpointError)


def test_pull_hf_also_writes_a_directory_transformers_loads(folder: Path, tmp_path: Path) -> None:
    """The export itself is held to our logits in test_export_hf.py; here: pull writes it beside the checkpoint."""
    code, output = pull("--from", str(folder), "--out", str(tmp_path / "model"), "--hf", "--json")
    assert code == 0, output
    files = json.loads(output)["files"]
    assert {"hf/config.json", "hf/model.safetensors", MODEL} <= set(files)
    config = json.loads((tmp_path / "model" / "hf" / "config.json").read_text())
    model = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["model_type"] == "gpt2" and (config["n_layer"], config["n_embd"]) == (model["n_layer"], model["d_model"])


@pytest.mark.parametrize("store", ["s3", "gs"], indirect=True)
def test_checkpoints_mirrored_to_object_storage_are_pulled_from_there_and_pruned_there_too(
    store: str,  # noqa: F811 - the fixture from test_storage
    tmp_path: Path,
) -> None:
    """Against a real moto S3 server and the GCS fake: the same bytes as the syncer's disk, old ones gone."""
    from ddctl_agents import storage

    url = storage.join(store, "run1")
    assembly = Assembly.build(small_run(learners=2))
    policy = CheckpointPolicy(every_s=0, keep_last=1, url=url)
    settings = ServiceSettings(state_dir=tmp_path / "state", snapshot_every_s=3600, checkpoints=policy)

    async def train() -> list[dict]:
        rt = SyncerRuntime(assembly, settings)
        await rt.start()
        await rt.register("L0", 1, "a")
        await rt.register("L1", 1, "b")
        taken = []
        for r in range(2):
            for learner in ("L0", "L1"):
                await rt.push(learner, frame_for(rt, learner, r, 0.02 * (r + 1)))
            await settle(rt, r + 1)
            taken.append(await rt.checkpoint())
        await rt.stop()
        return taken

    taken = asyncio.run(train())
    assert [t["uploaded"] for t in taken] == [storage.join(url, "ckpt-000001"), storage.join(url, "ckpt-000002")]
    assert sorted(u.removeprefix(url + "/") for u in storage.listing(url)) == [
        "ckpt-000002/manifest.json", "ckpt-000002/model.safetensors", "ckpt-000002/outer.safetensors", "index.json"
    ]  # fmt: skip
    code, output = pull("--from", url, "--out", str(tmp_path / "model"), "--json")
    assert code == 0, output
    assert json.loads(output)["checkpoint"] == "ckpt-000002"
    local = tmp_path / "state" / "checkpoints" / "ckpt-000002"
    assert (tmp_path / "model" / MODEL).read_bytes() == (local / MODEL).read_bytes()


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"name": "../../etc", "rounds": 1, "merged": 1, "val_bpb": 1.0}, "checkpoints.0.name"),
        ({"name": "ckpt-000001", "rounds": 1, "merged": "lots", "val_bpb": 1.0}, "checkpoints.0.merged"),
        ({"name": "ckpt-000001", "rounds": -3, "merged": 1, "val_bpb": 1.0}, "checkpoints.0.rounds"),
        ({"name": "ckpt-000001", "rounds": 1, "merged": 1, "val_bpb": "NaN"}, "checkpoints.0.val_bpb"),
    ],
)
def test_a_hostile_index_is_refused_naming_the_field_and_nothing_is_read_by_its_names(
    folder: Path, tmp_path: Path, entry: dict, words: str
) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    (copy / "index.json").write_text(json.dumps({"checkpoints": [entry]}))
    for args in (["--list"], ["--out", str(tmp_path / "out")]):
        code, output = pull("--from", str(copy), *args)
        assert code == 3 and "not a checkpoint index" in output and words in output, output
    assert not (tmp_path / "out").exists()
