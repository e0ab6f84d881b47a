"""A new run that starts from an old run's checkpoint: its model, outer momentum, versions and token books.

``ddctl up --resume-from CHECKPOINT`` copies the checkpoint into the new job's directory and the
syncer starts with ``--resume-from``. Every fresh syncer of the run (its first life, and each
recovery before its first snapshot) is seeded from it, so the write-ahead log always replays on top
of the same start. Learners bootstrap from the seeded fragments as from any others, and register at
the step the checkpoint recorded for them, so their schedules and data streams continue. A shard of a
sharded synchronizer is seeded from the same whole checkpoint and serves its own fragments of it, its
books the share of the checkpoint's that its fragments carry (the shards' books add up to them). A
checkpoint of another model is refused here, naming what differs, before anything is served.
"""

from __future__ import annotations

from pathlib import Path

from ddctl_agents import storage
from ddctl_agents.core.ledger import TokenLedger
from ddctl_agents.core.links import LearnerLinks
from ddctl_agents.core.shard_syncer import ShardSynchronizer
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.jsonable import to_json
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.checkpoint import Checkpoint, CheckpointError, load

BOOKS = ("merged", "late_merged", "dropped", "rejected")
"""The ledger's settled books a resumed run carries over; what was pending in an open round is not in the model."""


def read_local(path: Path, assembly: Assembly) -> Checkpoint:
    """The checkpoint in directory ``path``, checked against this job's model (names, shapes, config)."""

    def read(name: str, max_bytes: int) -> bytes:
        try:
            return storage.get(str(path / name), max_bytes)
        except storage.StorageError as exc:
            raise CheckpointError(str(exc)) from None

    checkpoint = load(read, {n: tuple(t.shape) for n, t in assembly.initial.items()})
    ours = to_json(assembly.model_config)
    if checkpoint.manifest.model != ours:
        differ = sorted(k for k in ours if checkpoint.manifest.model.get(k) != ours[k])
        raise CheckpointError(f"{path}: the checkpoint's model differs from this job's in {', '.join(differ) or 'its keys'}")
    return checkpoint


def share(tokens: int, syncer: Synchronizer) -> int:
    """A shard's part of the checkpoint's ``tokens``: its fragments' share, the rest of the division to the owner of
    fragment 0, so the shards' books (``tokens`` each reports) add up to the checkpoint's exactly."""
    if not isinstance(syncer, ShardSynchronizer):
        return tokens
    role = syncer.role
    count, owned = syncer.fragmentation.count, role.owned
    rest = tokens - sum(tokens * len(role.map.owned(shard)) // count for shard in role.map.shards)
    return tokens * len(owned) // count + (rest if 0 in owned else 0)


def seed(syncer: Synchronizer, checkpoint: Checkpoint) -> None:
    """Overwrite a freshly built syncer with the checkpoint's model and books (it was checked against the job)."""
    manifest, count = checkpoint.manifest, syncer.fragmentation.count
    if len(manifest.versions) != count:
        raise CheckpointError(
            f"the checkpoint has {len(manifest.versions)} fragments; this job has {count} (fragments must match)"
        )
    for p in range(count):
        names = list(syncer.fragments[p])
        syncer.fragments[p] = {n: checkpoint.params[n].clone() for n in names}
        if checkpoint.momentum is not None:
            syncer.buffers[p] = {n: checkpoint.momentum[n].clone() for n in names if n in checkpoint.momentum}
    syncer.versions = list(manifest.versions)
    syncer.clock = {**syncer.clock, **manifest.vclock}
    books = {k: share(manifest.tokens.get(k, 0), syncer) * count for k in BOOKS}  # tokens -> fragment-tokens
    syncer.ledger = TokenLedger(received=sum(books.values()), **books)
    for learner, step in manifest.steps.items():
        syncer.links.setdefault(learner, LearnerLinks()).pace.last_step = step
