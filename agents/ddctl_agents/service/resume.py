"""A new run that starts from an old run's checkpoint: its model, outer momentum, versions and token books.

``ddctl up --resume-from CHECKPOINT`` copies the checkpoint into the new job's directory and the
syncer starts with ``--resume-from``. Every fresh syncer of the run (its first life, and each
recovery before its first snapshot) is seeded from it, so the write-ahead log always replays on top
of the same start. Learners bootstrap from the seeded fragments as from any others, and register at
the step the checkpoint recorded for them, so their schedules and data streams continue. A shard of a
sharded synchronizer is seeded from the same whole checkpoint and serves its own fragments of it, its
books the share of the checkpoint's that its fragments carry (the shards' books add up to them). A
checkpoint of another model is refused here, naming what differs, before anything is served.

A run's own syncer whose state is gone (its machine replaced with a fresh disk) resumes the same way,
from the run's newest checkpoint in object storage (``starting_point``), where it would otherwise
start over from the initial model.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from ddctl_agents import storage
from ddctl_agents.core.ledger import TokenLedger
from ddctl_agents.core.links import LearnerLinks
from ddctl_agents.core.shard_syncer import ShardSynchronizer
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.core.text import printable
from ddctl_agents.jsonable import to_json
from ddctl_agents.service.checkpoints import INDEX, NAME
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.checkpoint import MANIFEST, MAX_MANIFEST_BYTES, Checkpoint, CheckpointError, load, write_directory
from ddctl_agents.train.job import JobConfig

log = logging.getLogger(__name__)

OWN = "resume"
"""Where in its state directory a syncer keeps the checkpoint of its run it started from (``starting_point``)."""
BOOKS = ("merged", "late_merged", "dropped", "rejected")
"""The ledger's settled books a resumed run carries over; what was pending in an open round is not in the model."""


def job_digest(config: JobConfig) -> str:
    """The sha256 a checkpoint and a state directory carry of the job they are of."""
    return hashlib.sha256(json.dumps(to_json(config), sort_keys=True).encode()).hexdigest()


def starting_point(state_dir: Path, checkpoint_url: str, given: Path | None, run: str, job: JobConfig) -> Path | None:
    """Where a syncer starts its history: the checkpoint its state directory started from, kept there; else, for a
    state directory that is new (the syncer's machine replaced with a fresh disk) of a run that checkpoints to object
    storage (``checkpoint_url``), the newest there of this run and job that reads whole, copied in first so that every
    recovery of this directory starts from the same one; else ``given`` (``--resume-from``). The learners start over
    from it (``service/history.py``)."""
    own = state_dir / OWN
    if (own / MANIFEST).is_file():
        return own
    if not checkpoint_url or (state_dir.is_dir() and any(state_dir.iterdir())):
        return given
    for name in reversed(_listed(checkpoint_url)):
        where, copied = storage.join(checkpoint_url, name), dict[str, bytes]()

        def read(file: str, max_bytes: int, where: str = where, copied: dict[str, bytes] = copied) -> bytes:
            copied[file] = storage.get(storage.join(where, file), max_bytes)
            return copied[file]

        try:
            manifest = load(read).manifest
            if (manifest.run, manifest.job_sha256) != (run, job_digest(job)):
                raise CheckpointError(f"it is of run {printable(manifest.run, 80)} or of another job")
        except (CheckpointError, storage.StorageError) as exc:
            log.warning("the run's checkpoint %s cannot be started from (%s); trying the one before it", where, exc)
            continue
        write_directory(own, {f: copied[f] for f in sorted(copied, key=lambda f: f == MANIFEST)})  # the manifest last
        log.info("a new state directory: this syncer starts from the run's newest checkpoint, %s", where)
        return own
    return given


def _listed(checkpoint_url: str) -> list[str]:
    """The checkpoints the run's index in object storage lists, oldest first: only names a checkpoint can have."""
    try:
        index = json.loads(storage.get(storage.join(checkpoint_url, INDEX), MAX_MANIFEST_BYTES))
    except storage.StorageError as exc:  # none yet is the usual first start; anything else, the operator should know
        (log.info if exc.kind == "missing" else log.warning)("no checkpoint of this run to start from: %s", exc)
        return []
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        log.warning("the checkpoint index at %s is not JSON: starting without it", checkpoint_url)
        return []
    entries = index.get("checkpoints") if isinstance(index, dict) else None
    names = [e.get("name") for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    return [n for n in names if isinstance(n, str) and NAME.fullmatch(n)]


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
