"""``ddctl syncer checkpoint``: one consistent checkpoint of a sharded synchronizer's model, joined from its shards.

The coordinator picks the next checkpoint epoch (one past the highest any shard
has cut at), sends every shard its marker, and each answers with its part once
the part is on its disk (``service/cuts.py``: the colouring makes the parts one
consistent cut). The parts are fetched and checked like any checkpoint
(manifest, sizes, sha256), then checked against each other: one run and job,
one shard map, every fragment exactly once and by its owner. The joined
checkpoint is the model's every parameter, evaluated here, written whole or not
at all; ``ddctl pull --from DIR`` reads it like any other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ddctl.control.shard_status import job_figure
from ddctl.errors import DdctlError, UnreachableError
from ddctl_agents.agent.client import SyncerClient, Unavailable, retry
from ddctl_agents.agent.routes import discover
from ddctl_agents.core import vclock
from ddctl_agents.core.shardmap import ShardMap
from ddctl_agents.train.checkpoint import Checkpoint, encode, load, read_manifest, write_directory


def take(urls: list[str], connect: Callable[[str], SyncerClient], out: Path,
         evaluate: Callable[[dict[str, torch.Tensor]], float] | None = None,
         shapes: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, Any]:  # fmt: skip
    """A global checkpoint of the shards at ``urls`` (every shard of one job), written to the new directory ``out``."""
    if out.exists():
        raise DdctlError(f"{out} exists; give a new directory for the checkpoint (nothing was written)")
    files, result = take_files(urls, connect, evaluate, shapes)
    write_directory(out, files)
    return {"path": str(out), **result}


def take_files(urls: list[str], connect: Callable[[str], SyncerClient],
               evaluate: Callable[[dict[str, torch.Tensor]], float] | None = None,
               shapes: Mapping[str, tuple[int, ...]] | None = None) -> tuple[dict[str, bytes], dict[str, Any]]:  # fmt: skip
    """A global checkpoint of the shards at ``urls`` as a checkpoint's files, and what it is (cut, rounds, val_bpb)."""
    clients = {url: connect(url) for url in urls}
    try:
        routes = discover(urls, lambda url: retry(clients[url].shards, give_up_after_s=30.0))
        if routes.map is None:
            raise DdctlError(f"{urls[0]} is not sharded: its checkpoints are whole models already (ddctl pull)")
        epoch = 1 + max(int(retry(c.status, give_up_after_s=30.0)["clock"].get(vclock.CUT, 0)) for c in clients.values())
        parts = [_part(clients[url], epoch) for url in routes.urls()]
    except Unavailable as exc:
        raise UnreachableError(f"a shard could not be reached: {exc}") from None
    finally:
        for client in clients.values():
            client.close()
    joined = join(parts, routes.map, epoch)
    if shapes is not None and {n: tuple(t.shape) for n, t in joined.params.items()} != dict(shapes):
        raise DdctlError("the shards' parts together are not the job's model (names or shapes differ); nothing was written")
    val_bpb = evaluate(joined.params) if evaluate is not None else None
    manifest = joined.manifest.model_dump(exclude={"format", "files"}) | {"val_bpb": val_bpb}
    files = encode(joined.params, joined.momentum, manifest)
    return files, {"cut": epoch, "shards": list(routes.map.shards), "val_bpb": val_bpb, "rounds": manifest["rounds"],
                   "versions": manifest["versions"], "bytes": sum(map(len, files.values()))}  # fmt: skip


def _part(client: SyncerClient, epoch: int) -> Checkpoint:
    """One shard's part: the marker, then its files, each checked against the part's manifest."""
    answer = client.cut(epoch)
    manifest = read_manifest(json.dumps(answer).encode())
    if manifest.part is None or manifest.part.cut != epoch:
        raise DdctlError(f"{client.url} answered the marker of checkpoint {epoch} with something that is not its part")
    return load(lambda name, limit: client.cut_file(epoch, name, limit))


def join(parts: list[Checkpoint], shard_map: ShardMap, epoch: int) -> Checkpoint:
    """The parts as one checkpoint: each shard's fragments, each fragment once, the books added up."""
    first = parts[0].manifest
    versions = [0] * shard_map.fragments
    params: dict[str, torch.Tensor] = {}
    momentum: dict[str, torch.Tensor] = {}
    for part in parts:
        m, info = part.manifest, part.manifest.part
        assert info is not None
        if (m.run, m.job_sha256) != (first.run, first.job_sha256):
            raise DdctlError(f"shard {info.shard}'s part is of run {m.run!r}, not {first.run!r}: these are not one job's shards")
        # a shard that no move touched may serve an older epoch: what counts is owning what the newest map gives it
        if info.map_epoch > shard_map.epoch or sorted(shard_map.owned(info.shard)) != info.fragments:
            raise DdctlError(
                f"shard {info.shard} cut fragments {info.fragments} at shard map epoch {info.map_epoch}; the map in "
                f"force (epoch {shard_map.epoch}) gives it {sorted(shard_map.owned(info.shard))}: take the checkpoint again"
            )
        if set(params) & set(part.params):
            raise DdctlError(f"shard {info.shard}'s part repeats parameters another part holds")
        params |= part.params
        momentum |= part.momentum or {}
        for p in info.fragments:
            versions[p] = m.versions[p]
    if sorted(p.manifest.part.shard for p in parts if p.manifest.part) != sorted(shard_map.shards):
        raise DdctlError(f"a global checkpoint needs every shard's part ({', '.join(shard_map.shards)})")
    manifests = [p.manifest for p in parts]
    tokens: dict[str, int] = {}
    steps: dict[str, int] = {}
    for m in manifests:
        tokens = {k: job_figure(k, tokens.get(k, 0), m.tokens.get(k, 0)) for k in sorted({*tokens, *m.tokens})}
        steps = {k: max(steps.get(k, 0), m.steps.get(k, 0)) for k in sorted({*steps, *m.steps})}
    clock: dict[str, int] = {}
    for m in manifests:
        clock = vclock.merge(clock, m.vclock)
    manifest = first.model_copy(
        update={"created_at": max(m.created_at for m in manifests), "rounds": sum(m.rounds for m in manifests),
                "versions": versions, "vclock": clock, "tokens": tokens, "steps": steps, "part": None, "cut": epoch}
    )  # fmt: skip
    return Checkpoint(manifest, params, momentum)


def job_assembly(job_dir: Path) -> Any:
    """The job in ``job_dir`` built as its syncer builds it (its own model's source included): what evaluates it."""
    from ddctl_agents.service.server import load_job_dir
    from ddctl_agents.train.assembly import Assembly

    files = load_job_dir(job_dir)
    return Assembly.build(files.job, model_dir=files.model_dir)
