"""Checkpoints of the global model while the job runs: when to take one, where it goes, which are kept.

Every ``every_rounds`` merged rounds or ``every_s`` seconds (whichever comes first, and only when
rounds were merged since the last), and once more when the job finishes, the syncer writes the
merged model (``train/checkpoint.py``) to ``STATE_DIR/checkpoints/ckpt-<n>`` and, with a ``url``,
to object storage under ``URL/ckpt-<n>``. The files go first and the manifest last, so a reader
never sees half a checkpoint. ``index.json`` lists what is kept, newest last; the newest ``keep_last``
and every ``keep_every``-th are kept. Capture is on the core thread (tensors are shared, not copied:
the syncer replaces a fragment's tensors, never writes into them); evaluation, encoding and
writing run off it, while rounds go on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ddctl_agents import storage
from ddctl_agents.errors import ConfigError
from ddctl_agents.jsonable import to_json
from ddctl_agents.service.ending import tokens
from ddctl_agents.train.checkpoint import MANIFEST, encode, write_directory

if TYPE_CHECKING:
    from ddctl_agents.service.runtime import SyncerRuntime

log = logging.getLogger(__name__)
INDEX = "index.json"
NAME = re.compile(r"ckpt-(\d{6})")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointPolicy:
    every_rounds: int = 0
    """Take one after this many merged rounds (0: not by rounds)."""
    every_s: float = 600.0
    """Take one after this many seconds (0: not by time); the job's end always takes one."""
    keep_last: int = 3
    keep_every: int = 0
    """Also keep every checkpoint whose number is a multiple of this (0: none besides the last ones)."""
    url: str = ""
    """Also write each to object storage here (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, or a directory)."""


def checkpoint_policy(every_rounds: int, every_s: float, keep_last: int, keep_every: int, url: str) -> CheckpointPolicy:
    """The policy from its flags, each checked; ConfigError naming the flag and what is allowed."""
    for flag, value in (("--checkpoint-every-rounds", every_rounds), ("--keep-every", keep_every)):
        if value < 0:
            raise ConfigError(f"{flag} must be >= 0, got {value}")
    if not every_s >= 0:
        raise ConfigError(f"--checkpoint-every must be >= 0 seconds, got {every_s}")
    if keep_last < 1:
        raise ConfigError(f"--keep-last must be >= 1 (the newest checkpoint is always kept), got {keep_last}")
    if url:
        storage.check(url)
    return CheckpointPolicy(every_rounds=every_rounds, every_s=every_s, keep_last=keep_last, keep_every=keep_every, url=url)


def kept(numbers: list[int], keep_last: int, keep_every: int) -> list[int]:
    """The checkpoint numbers to keep: the newest ``keep_last`` and every ``keep_every``-th (pure)."""
    newest = sorted(numbers)[-keep_last:] if keep_last > 0 else []
    return sorted({n for n in numbers if n in newest or (keep_every > 0 and n % keep_every == 0)})


def name(number: int) -> str:
    return f"ckpt-{number:06d}"


def numbers(root: Path) -> list[int]:
    """The complete checkpoints under ``root`` (those with a manifest), oldest first."""
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := NAME.fullmatch(p.name)) and (p / MANIFEST).exists())


def due(policy: CheckpointPolicy, rounds: int, last_rounds: int, now: float, last_at: float) -> bool:
    """Whether a checkpoint is due: rounds were merged since the last, and enough of them or enough time passed."""
    if rounds <= last_rounds:
        return False
    by_rounds = policy.every_rounds > 0 and rounds - last_rounds >= policy.every_rounds
    by_time = policy.every_s > 0 and now - last_at >= policy.every_s
    return by_rounds or by_time


async def checkpoint_loop(rt: SyncerRuntime) -> None:
    """Take checkpoints as the policy says, until cancelled (the job's end takes its own)."""
    while True:
        await asyncio.sleep(1.0)
        policy, stats = rt.settings.checkpoints, rt.checkpoints
        rounds = await rt.view(lambda r: r.syncer.rounds_closed)
        if due(policy, rounds, int(stats["rounds"] or 0), rt.clock(), float(stats["last_at"] or rt.started_at)):
            await take_checkpoint(rt)


async def eval_loop(rt: SyncerRuntime) -> None:
    """The global model's val_bpb every ``eval_every_s``, for the status page's curve."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(rt.settings.eval_every_s)
        params, rounds = await rt.view(lambda r: (dict(r.syncer.global_params()), r.syncer.rounds_closed))
        bpb = await loop.run_in_executor(rt.io, rt.assembly.evaluate, params)
        rt.val_bpb.append((round(rt.clock(), 3), rounds, round(bpb, 5)))


async def take_checkpoint(rt: SyncerRuntime, val_bpb: float | None = None) -> dict[str, Any]:
    """One checkpoint now; ``val_bpb`` when the caller has just measured it (else it is measured here)."""
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    params, momentum, manifest = await rt.view(capture)
    if val_bpb is None:
        val_bpb = await loop.run_in_executor(None, rt.assembly.evaluate, params)
    manifest["val_bpb"] = float(val_bpb)  # exact: JSON round-trips a float, so a reload can reproduce it bit for bit
    written = await loop.run_in_executor(rt.io, _write, rt, params, momentum, manifest)
    stats = {**written, "seconds": round(time.perf_counter() - started, 4), "rounds": manifest["rounds"], "val_bpb": val_bpb}
    rt.checkpoints.update(taken=int(rt.checkpoints["taken"] or 0) + 1, last_at=rt.clock(), **stats)
    rt.roster.event(rt.clock(), "checkpoint", **{k: v for k, v in stats.items() if k != "uploaded"})
    return stats


def capture(rt: SyncerRuntime) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """On the core thread: one consistent moment of the model (a shard's: its own fragments) and its books."""
    s = rt.syncer
    owned = [p for p in range(s.fragmentation.count) if rt.role is None or p in rt.role.owned]
    params = {n: t for p in owned for n, t in s.fragments[p].items()}
    momentum = {n: t for p in owned for n, t in s.buffers[p].items()}
    steps = {m: links.pace.last_step for m, links in s.links.items()}
    steps |= {m: max(steps.get(m, 0), info.step) for m, info in rt.roster.info.items()}
    manifest = {
        "run": rt.settings.run,
        "created_at": round(rt.clock(), 3),
        "rounds": s.rounds_closed,
        "versions": list(s.versions),
        "vclock": dict(s.clock),
        "tokens": tokens(rt),
        "steps": steps,
        "model": to_json(rt.assembly.model_config),
        "job": rt.job_json,
        "job_sha256": rt.job_sha,
    }
    return params, momentum, manifest


def _write(
    rt: SyncerRuntime, params: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor], manifest: dict[str, Any]
) -> dict[str, Any]:
    """On the I/O thread: the checkpoint's files, stored with the syncer's others."""
    return store(rt.settings.state_dir / "checkpoints", encode(params, momentum, manifest), rt.settings.checkpoints)


def store(root: Path, files: dict[str, bytes], policy: CheckpointPolicy) -> dict[str, Any]:
    """A checkpoint's files as the next ``ckpt-<n>`` under ``root``: the files, the manifest last, then the index; the
    same to object storage; what ``policy`` does not keep removed. Also the controller's, for a sharded run's global
    checkpoints (``ddctl/control/run_checkpoints.py``)."""
    number = max(numbers(root), default=0) + 1
    final = root / name(number)
    write_directory(final, files)
    keep = kept(numbers(root), policy.keep_last, policy.keep_every)
    for old in set(numbers(root)) - set(keep):
        shutil.rmtree(root / name(old), ignore_errors=True)
    index = _index(root, keep)
    storage.put(str(root / INDEX), index)
    uploaded = _upload(policy, number, files, keep, index) if policy.url else None
    return {"name": name(number), "path": str(final), "bytes": sum(map(len, files.values())), "uploaded": uploaded}


def _index(root: Path, keep: list[int]) -> bytes:
    """What ``ddctl pull`` lists: each kept checkpoint's name, rounds, tokens merged and val_bpb, newest last."""
    entries = []
    for n in keep:
        manifest = json.loads((root / name(n) / MANIFEST).read_bytes())
        merged = manifest["tokens"].get("merged", 0)
        entries.append({"name": name(n), "rounds": manifest["rounds"], "merged": merged, "val_bpb": manifest["val_bpb"]})
    return json.dumps({"checkpoints": entries}, indent=1).encode()


def _upload(policy: CheckpointPolicy, number: int, files: dict[str, bytes], keep: list[int], index: bytes) -> str | None:
    """The same checkpoint to object storage, manifest last; old ones removed there too. A failure is logged, not
    fatal: the local copy stands, and the next checkpoint tries again."""
    where = storage.join(policy.url, name(number))
    try:
        for file, data in files.items():
            storage.put(storage.join(where, file), data)
        storage.put(storage.join(policy.url, INDEX), index)
        present = {m.group(1) for url in storage.listing(policy.url) if (m := NAME.search(url))}
        for old in sorted(int(n) for n in present if int(n) not in keep):
            for url in storage.listing(storage.join(policy.url, name(old))):
                storage.delete(url)
    except storage.StorageError as exc:
        log.error("checkpoint %s was not uploaded to %s: %s", name(number), policy.url, exc)
        return None
    return where
