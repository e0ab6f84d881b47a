"""Joining shards' parts into one checkpoint: every fragment once, by the owner in the map in force."""

from __future__ import annotations

import pytest
import torch

from ddctl.control.global_checkpoint import join
from ddctl.errors import DdctlError
from ddctl_agents.core.shardmap import ShardMap
from ddctl_agents.train.checkpoint import Checkpoint, Manifest

SHA = "a" * 64


def part(shard: str, fragments: list[int], map_epoch: int, run: str = "r", merged: int = 10) -> Checkpoint:
    versions = [0, 0, 0]
    for p in fragments:
        versions[p] = p + 1
    manifest = Manifest.model_validate({
        "format": "ddctl-checkpoint/1", "run": run, "created_at": 1.0, "rounds": len(fragments), "versions": versions,
        "vclock": {shard: 3, "cut": 2}, "tokens": {"merged": merged, "trained": 100}, "steps": {"L0": 8 * len(fragments)},
        "val_bpb": None, "model": {}, "job": {}, "job_sha256": SHA, "files": {},
        "part": {"shard": shard, "map_epoch": map_epoch, "cut": 2, "fragments": fragments},
    })  # fmt: skip
    params = {f"w{p}": torch.full((2,), float(p)) for p in fragments}
    return Checkpoint(manifest, params, {n: t * 0 for n, t in params.items()})


def test_parts_join_into_one_model_with_the_books_added_and_an_untouched_shard_at_an_older_epoch() -> None:
    newest = ShardMap(epoch=2, shards=("S0", "S1", "S2"), owners=(0, 0, 2))  # fragment 1 moved S1 -> S0 at epoch 2
    joined = join([part("S0", [0, 1], 2), part("S1", [], 2), part("S2", [2], 1)], newest, 2)
    assert sorted(joined.params) == ["w0", "w1", "w2"] and joined.manifest.versions == [1, 2, 3]
    assert joined.manifest.cut == 2 and joined.manifest.part is None and joined.manifest.rounds == 3
    assert joined.manifest.tokens == {
        "merged": 30,
        "trained": 100,
    }  # learners' own figure: not a sum and joined.manifest.steps == {"L0": 16}
    assert joined.manifest.vclock == {"S0": 3, "S1": 3, "S2": 3, "cut": 2}


@pytest.mark.parametrize(
    "parts, message",
    [
        ([part("S0", [0], 1), part("S1", [1, 2], 1)], "the map in force \\(epoch 2\\) gives it \\[0, 1\\]"),
        ([part("S0", [0, 1], 2)], "needs every shard's part"),
        ([part("S0", [0, 1], 2), part("S1", [2], 2, run="other")], "not one job's shards"),
    ],
)
def test_parts_that_are_not_one_cut_of_the_map_in_force_are_refused(parts: list[Checkpoint], message: str) -> None:
    with pytest.raises(DdctlError, match=message):
        join(parts, ShardMap(epoch=2, shards=("S0", "S1"), owners=(0, 0, 1)), 2)
