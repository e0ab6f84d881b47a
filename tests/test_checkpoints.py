"""Checkpoints of the global model: what the syncer writes, that it reads back whole or not at all, which are
kept, and a new run that resumes from one. The runtime runs in-process with real files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ddctl_agents.service.checkpoints import CheckpointPolicy, checkpoint_policy, due, kept
from ddctl_agents.service.resume import read_local
from ddctl_agents.service.runtime import SyncerRuntime
from ddctl_agents.service.settings import ServiceSettings
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.checkpoint import MANIFEST, MODEL, OUTER, CheckpointError, encode, load
from ddctl_agents.train.checksum import params_sha256
from tests.builders import small_run
from tests.test_service_recovery import frame_for, settle


@pytest.fixture(scope="module")
def assembly() -> Assembly:
    return Assembly.build(small_run(learners=2))


def reader(folder: Path) -> Any:
    return lambda name, max_bytes: (folder / name).read_bytes()


def test_the_newest_and_every_mth_are_kept() -> None:
    assert kept(list(range(1, 11)), keep_last=3, keep_every=4) == [4, 8, 9, 10]
    assert kept([1, 2], keep_last=3, keep_every=0) == [1, 2]
    assert kept(list(range(1, 11)), keep_last=1, keep_every=0) == [10]


def test_a_checkpoint_is_due_after_enough_rounds_or_time_and_never_without_a_new_round() -> None:
    policy = CheckpointPolicy(every_rounds=5, every_s=60.0)
    assert due(policy, rounds=5, last_rounds=0, now=10.0, last_at=0.0)
    assert not due(policy, rounds=4, last_rounds=0, now=10.0, last_at=0.0)
    assert due(policy, rounds=1, last_rounds=0, now=61.0, last_at=0.0)  # by time
    assert not due(policy, rounds=3, last_rounds=3, now=1e6, last_at=0.0)  # nothing merged since: nothing new to keep


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((-1, 0.0, 3, 0, ""), "--checkpoint-every-rounds must be >= 0"),
        ((0, -5.0, 3, 0, ""), "--checkpoint-every must be >= 0 seconds"),
        ((0, 0.0, 0, 0, ""), "--keep-last must be >= 1"),
        ((0, 0.0, 3, 0, "s3://"), "s3://BUCKET/KEY"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_flag(args: tuple[Any, ...], words: str) -> None:
    with pytest.raises(Exception, match=words.replace("(", r"\(")) as info:
        checkpoint_policy(*args)
    assert info.type.__name__ in ("ConfigError", "StorageError")


def _manifest(assembly: Assembly, **override: Any) -> dict[str, Any]:
    from ddctl_agents.jsonable import to_json

    base = {
        "run": "r",
        "created_at": 1.0,
        "rounds": 3,
        "versions": [1, 1, 0, 0],
        "vclock": {"syncer": 7},
        "tokens": {"merged": 4096},
        "steps": {"L0": 16},
        "val_bpb": 7.5,
        "model": to_json(assembly.model_config),
        "job": {},
        "job_sha256": "0" * 64,
    }
    return base | override


def test_a_checkpoint_reads_back_exactly_and_a_damaged_or_foreign_one_not_at_all(tmp_path: Path, assembly: Assembly) -> None:
    params = {n: t + 0.5 for n, t in assembly.initial.items()}
    momentum = {n: torch.full_like(t, 0.25) for n, t in assembly.initial.items()}
    files = encode(params, momentum, _manifest(assembly))
    assert list(files)[-1] == MANIFEST  # written last: its presence is what makes a checkpoint
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    shapes = {n: tuple(t.shape) for n, t in assembly.initial.items()}
    got = load(reader(tmp_path), shapes)
    assert params_sha256(got.params) == params_sha256(params) and got.momentum is not None
    assert all(torch.equal(got.momentum[n], momentum[n]) for n in momentum) and got.manifest.rounds == 3

    torn = bytearray(files[MODEL])
    torn[len(torn) // 2] ^= 0xFF  # one flipped bit in the middle of a tensor
    (tmp_path / MODEL).write_bytes(bytes(torn))
    with pytest.raises(CheckpointError, match="model.safetensors: its size or sha256 does not match"):
        load(reader(tmp_path), shapes)
    (tmp_path / MODEL).write_bytes(files[MODEL])
    other = {**shapes, "wte.weight": (shapes["wte.weight"][0] + 1, shapes["wte.weight"][1])}
    with pytest.raises(CheckpointError, match="wte.weight has shape"):
        load(reader(tmp_path), other)
    with pytest.raises(CheckpointError, match="missing"):
        load(reader(tmp_path), {**shapes, "extra.weight": (2,)})
    for bad, words in (
        ({"format": "other/9"}, "is not one this version reads"),
        ({"rounds": -1}, "rounds: Input should be greater than or equal to 0"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
    ):
        body = json.loads(files[MANIFEST]) | bad
        (tmp_path / MANIFEST).write_text(json.dumps(body))
        with pytest.raises(CheckpointError, match=words):
            load(reader(tmp_path), shapes)
    nan = {**params, "wte.weight": params["wte.weight"].clone().fill_(float("nan"))}
    nan_files = encode(nan, None, _manifest(assembly))
    for name, data in nan_files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / OUTER).unlink()
    with pytest.raises(CheckpointError, match="non-finite"):
        load(reader(tmp_path), shapes)


async def _train(rt: SyncerRuntime, rounds: int) -> None:
    await rt.register("L0", 1, "a")
    await rt.register("L1", 1, "b")
    for r in range(rounds):
        for learner in ("L0", "L1"):
            await rt.push(learner, frame_for(rt, learner, r % 4, 0.01 * (r + 1)))
        await settle(rt, r + 1)


def test_the_syncer_checkpoints_the_merged_model_keeps_the_policys_and_a_new_run_resumes_from_one(
    tmp_path: Path, assembly: Assembly
) -> None:
    policy = CheckpointPolicy(every_rounds=0, every_s=0.0, keep_last=2, keep_every=3, url=str(tmp_path / "bucket"))
    first = ServiceSettings(state_dir=tmp_path / "a", snapshot_every_s=3600, checkpoints=policy)

    async def old_run() -> tuple[dict[str, Any], dict[str, Any]]:
        rt = SyncerRuntime(assembly, first)
        await rt.start()
        stats = {}
        for n in range(1, 6):
            await _train(rt, 1) if n == 1 else await _more(rt, n)
            stats = await rt.checkpoint()
        view = {"params": params_sha256(rt.syncer.global_params()), "versions": list(rt.syncer.versions)}
        await rt.stop()
        return stats, view

    async def _more(rt: SyncerRuntime, n: int) -> None:
        for learner in ("L0", "L1"):
            await rt.push(learner, frame_for(rt, learner, n % 4, 0.01 * n))
        await settle(rt, n)

    stats, view = asyncio.run(old_run())
    root = tmp_path / "a" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-000003", "ckpt-000004", "ckpt-000005", "index.json"]
    index = json.loads((root / "index.json").read_text())["checkpoints"]
    assert [e["name"] for e in index] == ["ckpt-000003", "ckpt-000004", "ckpt-000005"] and index[-1]["rounds"] == 5
    newest = read_local(root / "ckpt-000005", assembly)
    assert params_sha256(newest.params) == view["params"] and newest.manifest.versions == view["versions"]
    assert newest.manifest.val_bpb == assembly.evaluate(newest.params) == stats["val_bpb"]  # bit for bit
    assert newest.manifest.tokens["merged"] > 0 and newest.manifest.steps["L0"] == 8
    uploaded = sorted(p.relative_to(tmp_path / "bucket").as_posix() for p in (tmp_path / "bucket").rglob("*") if p.is_file())
    assert uploaded == sorted(["index.json"] + [f"ckpt-00000{n}/{f}" for n in (3, 4, 5) for f in (MANIFEST, MODEL, OUTER)])

    resumed = ServiceSettings(state_dir=tmp_path / "b", snapshot_every_s=3600, resume_from=root / "ckpt-000005")

    async def new_run() -> tuple[str, list[int], int, dict[str, Any], str]:
        rt = SyncerRuntime(assembly, resumed)
        await rt.start()
        start = await rt.register("L0", 1, "a")
        books = await rt.view(lambda r: r.syncer.ledger.as_dict())
        await rt.stop()
        rt = SyncerRuntime(assembly, resumed)  # a restart of the resumed run starts from the same place
        await rt.start()
        again = params_sha256(rt.syncer.global_params())
        await rt.stop()
        return params_sha256(rt.syncer.global_params()), list(rt.syncer.versions), start["start_step"], books, again

    params, versions, start_step, books, again = asyncio.run(new_run())
    assert params == again == view["params"] and versions == view["versions"]
    assert start_step == 8  # L0 continues its schedule and data where it was
    assert books["merged"] == newest.manifest.tokens["merged"] * 4 and books["pending"] == 0  # fragment-tokens


@pytest.mark.parametrize("owners", [(0, 1, 0, 1), (0, 0, 0, 1), (2, 0, 1, 1), (1, 1, 1, 0)])
def test_each_shard_resumed_from_a_whole_checkpoint_serves_its_fragments_and_the_shards_books_add_up_to_its(
    tmp_path: Path, assembly: Assembly, owners: tuple[int, ...]
) -> None:
    """Books of 1001 merged tokens over 4 fragments do not split evenly: the owner of fragment 0 takes the rest."""
    from ddctl_agents.core.shardmap import ShardMap, ShardRole
    from ddctl_agents.service.resume import seed

    tokens = {"merged": 1001, "late_merged": 7, "dropped": 3, "rejected": 0}
    params = {n: t + 0.5 for n, t in assembly.initial.items()}
    for name, data in encode(params, None, _manifest(assembly, tokens=tokens, versions=[5, 6, 7, 8])).items():
        (tmp_path / name).write_bytes(data)
    checkpoint = read_local(tmp_path, assembly)
    shard_map = ShardMap(epoch=1, shards=tuple(f"S{i}" for i in range(max(owners) + 1)), owners=owners)
    shards = [assembly.new_syncer(ShardRole(name=name, map=shard_map)) for name in shard_map.shards]
    for shard in shards:
        seed(shard, checkpoint)
        assert shard.versions == [5, 6, 7, 8] and shard.clock["syncer"] == 7
        books = shard.ledger.as_dict()
        assert books["received"] == sum(books[k] for k in tokens) and books["pending"] == 0
        owned = shard_map.owned(shard.role.name)
        fair = {k: v * len(owned) // 4 for k, v in tokens.items()}
        extra = {k: v - sum(v * len(shard_map.owned(s)) // 4 for s in shard_map.shards) for k, v in tokens.items()}
        assert {k: books[k] // 4 for k in tokens} == {k: fair[k] + (extra[k] if 0 in owned else 0) for k in tokens}
        for p in owned:
            assert all(torch.equal(t, params[n]) for n, t in shard.fragments[p].items())
    for key, total in tokens.items():  # what each shard reports (its ledger // fragments) adds up to the checkpoint's
        assert sum(shard.ledger.as_dict()[key] // 4 for shard in shards) == total, key


def test_a_checkpoint_of_another_model_is_refused_before_the_syncer_serves(tmp_path: Path, assembly: Assembly) -> None:
    other = Assembly.build(small_run(learners=2, preset="small"))
    files = encode(other.initial, None, _manifest(other))
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(CheckpointError, match="is not this model's|has shape"):
        SyncerRuntime(assembly, ServiceSettings(state_dir=tmp_path / "s", resume_from=tmp_path))
    assert not (tmp_path / "s").exists()  # nothing was started


def test_bench_checkpoint_times_ours_beside_torch_save_and_load_of_the_same_tensors(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ddctl.bench.checkpoint import measure_checkpoint
    from ddctl.cli.app import app

    result = measure_checkpoint("tiny", repeats=1, folder=tmp_path)
    assert result["params"] == sum(t.numel() for t in Assembly.build(small_run()).initial.values())
    assert abs(result["bytes"] - result["torch_bytes"]) < 0.02 * result["torch_bytes"]  # the same tensors, both files
    for key in ("write", "read"):
        base = result["torch_save_s" if key == "write" else "torch_load_s"]
        assert result[f"{key}_s"] > 0 and base > 0 and result[f"{key}_ratio"] == round(result[f"{key}_s"] / base, 3)
    shown = CliRunner().invoke(app, ["bench", "checkpoint", "--preset", "tiny", "--repeats", "1", "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["preset"] == "tiny"
    refused = CliRunner().invoke(app, ["bench", "checkpoint", "--preset", "huge"])
    assert refused.exit_code == 2 and "preset must be one of" in refused.output
