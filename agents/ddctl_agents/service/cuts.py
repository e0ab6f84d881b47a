"""One shard's part of a consistent global checkpoint (Chandy-Lamport, the colouring variant).

``ddctl syncer checkpoint`` picks a checkpoint epoch e and sends every shard a
marker (``POST /v1/admin/cut``). At its marker a shard's clock takes ``cut = e``
(``Synchronizer.cut``). Every fragment version a shard sends carries its clock,
learners merge the clocks they receive and stamp their updates with theirs, so
an update sent after its learner saw epoch e carries e; a shard that receives
one before its own marker takes its cut first (``colour``). So no update that
follows one shard's cut is inside another's part, and an update in flight at a
cut needs no recording: it is applied once acknowledged, by one shard, on one
side of that shard's cut, and the learner retries until it is.

The part is the shard's fragments and their momentum at its cut, captured by
reference on the core thread (the core never mutates a tensor in place), written
as a checkpoint with a ``part`` field under ``STATE/cuts/cut-NNNNNN/`` (manifest
last), and answered once durable; the coordinator fetches the files and joins
the parts. A colour is trusted only one epoch past the last marker this shard
saw: a learner cannot make a shard cut (and write a model's worth) at will.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ddctl_agents.core import vclock
from ddctl_agents.core.messages import Update
from ddctl_agents.errors import NotFound
from ddctl_agents.service.checkpoints import capture
from ddctl_agents.service.log_records import CutEntry
from ddctl_agents.train.checkpoint import MANIFEST, MODEL, OUTER, encode, write_directory

if TYPE_CHECKING:
    from ddctl_agents.service.runtime import SyncerRuntime

KEEP = 3
"""Parts kept on a shard's disk: the newest few (a coordinator joins one within seconds of asking)."""
FILES = (MODEL, OUTER, MANIFEST)


class Cuts:
    """The checkpoint epochs this shard has cut at, and the parts being written or written."""

    def __init__(self, root: Path, marker: int) -> None:
        self.root = root
        self.marker = marker
        """The newest epoch a marker (or a recovered cut) brought: colours are trusted one epoch past it."""
        self.writing: dict[int, Future[dict[str, Any]]] = {}
        self.taken = {"marker": 0, "update": 0}
        """Cuts this process took, by what triggered them (for /metrics)."""

    def folder(self, epoch: int) -> Path:
        return self.root / f"cut-{epoch:06d}"


def colour(rt: SyncerRuntime, update: Update) -> None:
    """On the core thread, before ``update`` is received: a coloured update from past this shard's cut cuts it first."""
    epoch, own = update.vclock.get(vclock.CUT, 0), rt.syncer.clock.get(vclock.CUT, 0)
    if rt.role is not None and own < epoch <= rt.cuts.marker + 1:
        _take(rt, epoch, "update")


async def marker(rt: SyncerRuntime, epoch: int) -> dict[str, Any]:
    """The coordinator's marker for ``epoch``: cut now (or find the cut a coloured update made); the part's manifest."""
    if rt.role is None:
        raise NotFound("this synchronizer is not sharded: its checkpoints are whole (ddctl pull)")
    position = await rt.view(lambda r: _marker(r, epoch))
    await rt.commit_to(position)
    future = rt.cuts.writing.get(epoch)
    if future is not None:
        return await asyncio.wrap_future(future)
    path = rt.cuts.folder(epoch) / MANIFEST
    if not path.exists():
        raise NotFound(f"shard {rt.role.name} holds no part of checkpoint {epoch} (it keeps the newest {KEEP}); "
                       "take a new checkpoint")  # fmt: skip
    return dict(json.loads(path.read_bytes()))


def part_file(rt: SyncerRuntime, epoch: int, name: str) -> bytes:
    """One file of a written part, for the coordinator."""
    path = rt.cuts.folder(epoch) / name
    if name not in FILES or not (rt.cuts.folder(epoch) / MANIFEST).exists() or not path.exists():
        raise NotFound(f"no {name!r:.40} in a written part of checkpoint {epoch} here")
    return path.read_bytes()


def _marker(rt: SyncerRuntime, epoch: int) -> int:
    """On the core thread: cut at ``epoch`` unless this shard already has; the log position to wait for."""
    assert rt.wal is not None
    rt.cuts.marker = max(rt.cuts.marker, epoch)
    if epoch > rt.syncer.clock.get(vclock.CUT, 0):
        _take(rt, epoch, "marker")
    return rt.wal.appended


def _take(rt: SyncerRuntime, epoch: int, trigger: str) -> None:
    """On the core thread: the marker point. Clock, log and tape first, then the state captured as it is here."""
    assert rt.wal is not None and rt.role is not None
    now = rt.clock()
    rt.apply_effects(rt.syncer.cut(now, epoch, trigger))
    rt.wal.append(CutEntry(t=now, epoch=epoch, trigger=trigger).model_dump())  # type: ignore[arg-type]
    params, momentum, manifest = capture(rt)
    role = rt.role
    manifest |= {"val_bpb": None, "part": {"shard": role.name, "map_epoch": role.map.epoch, "cut": epoch,
                                           "fragments": sorted(role.owned)}}  # fmt: skip
    rt.roster.event(now, "cut", epoch=epoch, trigger=trigger)
    rt.cuts.taken[trigger] += 1
    rt.cuts.writing = {e: f for e, f in rt.cuts.writing.items() if e > epoch - KEEP}
    rt.cuts.writing[epoch] = rt.io.submit(_write, rt.cuts, epoch, params, momentum, manifest)


def _write(cuts: Cuts, epoch: int, params: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor],
           manifest: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """On the I/O thread: the part's files, the manifest last, each fsynced; then only the newest KEEP parts stay."""
    files = encode(params, momentum, manifest)
    write_directory(cuts.folder(epoch), files)
    for old in sorted(p for p in cuts.root.glob("cut-*") if p.is_dir())[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return dict(json.loads(files[MANIFEST]))
