"""A run's checkpoints on this machine: where they are, ``ddctl pull``, and what ``up --resume-from`` starts from.

A checkpoint is read from wherever it is: a local directory, object storage (``s3://``, ``gs://``),
or a run's own places, tried in order: a sharded run's checkpoints, which the controller takes and
keeps here (``control/run_checkpoints.py``), the syncer's disk as this machine sees it (a local syncer's
state directory, a Docker syncer's persistent disk), the run's ``checkpoints.url``, then the syncer's
machine over SSH. A source is either one checkpoint (it has a manifest) or a checkpoints folder (its
``index.json`` lists them; the newest is the default). Every file is checked against the manifest
and the model before anything is written here (``train/checkpoint.py``), and the output directory
is written whole or not at all.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ddctl import providers
from ddctl.control.jobdata import checkpoint_shapes, model_shapes
from ddctl.control.rundir import RunDir
from ddctl.control.state import State
from ddctl.errors import DdctlError
from ddctl.providers.base import Instance, Provider
from ddctl.providers.deploy import REMOTE_ROOT, TooLarge
from ddctl_agents import storage
from ddctl_agents.errors import ConfigError
from ddctl_agents.jsonable import from_json, to_json
from ddctl_agents.train.checkpoint import MANIFEST, MODEL, Checkpoint, CheckpointError, load, read_manifest
from ddctl_agents.train.config import InnerConfig, ModelConfig
from ddctl_agents.train.modelfiles import MODEL_DIR, pack
from ddctl_agents.train.presets import model_config

INDEX = "index.json"
MAX_INDEX_BYTES = 1 << 20
CONFIG = "config.json"
"""Written beside the tensors by ``pull``: the model's config, as the built-in model is built from it."""


@dataclass(frozen=True, slots=True)
class Source:
    """Where checkpoints are: ``read(relative name, max_bytes)`` under it, and a label that says where."""

    label: str
    read: Callable[[str, int], bytes]


def open_source(where: str) -> Source:
    """A local directory or an object-storage prefix, read through one module (``ddctl_agents.storage``)."""
    if not (storage.is_remote(where) or where.startswith("file://")):
        root = Path(where).expanduser().resolve()
        if not root.is_dir():
            raise DdctlError(
                f"{where}: no such directory; a checkpoint is a directory or s3://BUCKET/PREFIX or gs://BUCKET/PREFIX"
            )
        where = str(root)
    storage.check(where)
    return Source(where, lambda name, limit: storage.get(storage.join(where, name), limit))


def run_source(run: str, state: State) -> Source:
    """Where the run's checkpoints are: a sharded run's (the controller's, or its final model), else its syncer's disk
    here, its object storage, then its syncer over SSH."""
    record = state.run(run)
    if record is None:
        raise DdctlError(f"no run named {run!r}; `ddctl ls` lists them, or give --from DIR|URL")
    rundir = RunDir(run)
    if (rundir.global_checkpoints / INDEX).is_file():  # a sharded run's, taken by the controller (its final one newest)
        return open_source(str(rundir.global_checkpoints))
    if (rundir.final / MANIFEST).is_file():  # a sharded run's final model, joined from its shards when it ended
        return open_source(str(rundir.final))
    for local in (rundir.checkpoints(local=True), rundir.checkpoints(local=False)):
        if (local / INDEX).exists():
            return open_source(str(local))
    url = str(record.detail.get("checkpoint_url") or "")
    if url:
        return open_source(url)
    for kind in sorted(set(record.detail.get("kinds", {}).values())):
        provider = providers.get(kind)
        syncer = next((i for i in provider.list_run(run) if i.name == "syncer"), None)
        if syncer is not None:
            return _remote_source(provider, syncer, kind)
    raise DdctlError(f"run {run} has no checkpoints here: none on the syncer's disk, no checkpoints.url, and no syncer to ask")


class IndexEntry(BaseModel):
    """One line of a checkpoints folder's ``index.json``, checked: its name becomes part of a path."""

    model_config = ConfigDict(extra="ignore")
    name: Annotated[str, Field(pattern=r"^(ckpt-\d{6})?$")]
    rounds: Annotated[int, Field(ge=0)]
    merged: Annotated[int, Field(ge=0)]
    val_bpb: Annotated[float, Field(ge=0)] | None


class Index(BaseModel):
    checkpoints: Annotated[list[IndexEntry], Field(max_length=100_000)]


def listing(source: Source) -> list[dict[str, Any]]:
    """The checkpoints a folder's index lists, oldest first (one entry for a single checkpoint)."""
    try:
        raw = source.read(INDEX, MAX_INDEX_BYTES)
    except (storage.StorageError, FileNotFoundError):
        try:
            manifest = read_manifest(source.read(MANIFEST, 1 << 20))  # not a folder: one checkpoint, or neither (raises)
        except CheckpointError as exc:
            raise CheckpointError(f"{source.label}: {exc}") from None
        return [{"name": "", "rounds": manifest.rounds, "merged": manifest.tokens.get("merged", 0), "val_bpb": manifest.val_bpb}]
    try:
        return [entry.model_dump() for entry in Index.model_validate_json(raw).checkpoints]
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "the document"
        raise CheckpointError(f"{source.label}/{INDEX}: not a checkpoint index ({where}: {error['msg']})") from None


def fetch(
    source: Source, name: str = "", expect: Mapping[str, tuple[int, ...]] | None = None, model: Mapping[str, Any] | None = None
) -> tuple[Checkpoint, dict[str, bytes], str]:
    """The chosen checkpoint (default: the newest), checked whole against ``expect`` (the parameters it must hold;
    default: the built-in model's for its config, or its own for a model of yours); its files' bytes, and its name.

    A checkpoint that is damaged or inconsistent raises CheckpointError naming it (bad input data); one whose model
    config is not ``model`` (the caller's job's) raises DdctlError naming the keys that differ (a settings mismatch)."""
    entries = listing(source)
    names = [e["name"] for e in entries]
    if not names:
        raise DdctlError(f"{source.label} holds no checkpoint yet (its index lists none)")
    chosen = name or names[-1]
    if chosen not in names:
        raise DdctlError(f"{source.label} has no checkpoint {name!r}; it has {', '.join(names) or 'none'}")
    prefix = f"{chosen}/" if chosen else ""
    files: dict[str, bytes] = {}

    def read(file: str, limit: int) -> bytes:
        files[file] = source.read(prefix + file, limit)
        return files[file]

    try:
        manifest = read_manifest(read(MANIFEST, 1 << 20))
        if model is not None and manifest.model != model:
            differ = sorted(k for k in model if manifest.model.get(k) != model[k])
            raise DdctlError(
                f"{source.label}/{chosen or '.'}: its model differs from this job's in {', '.join(differ) or 'its keys'}; "
                "resume with the training knobs (preset) it was trained with"
            )
        inner = manifest.job.get("inner")
        custom = isinstance(inner, dict) and bool(inner.get("model"))  # yours: its source is the job's, not here
        if expect is None and not custom:  # a shard's part holds less than the model: ``load`` refuses it, saying so
            config = from_json(ModelConfig, manifest.model)
            expect = checkpoint_shapes(config, manifest.files[MODEL].bytes, MODEL, whole=manifest.part is None)
        checkpoint = load(read, expect)
    except ConfigError as exc:  # the checkpoint is damaged, or its manifest names a model config no model has: bad data
        raise CheckpointError(f"{source.label}/{chosen or '.'}: {exc}") from None
    except storage.StorageError as exc:  # it could not be read
        raise DdctlError(f"{source.label}/{chosen or '.'}: {exc}") from None
    except FileNotFoundError as exc:  # the syncer pruned it while we read it: a newer one is there
        raise DdctlError(
            f"{source.label}/{chosen}: {exc.args[0] if exc.args else 'a file'} went away while it was "
            "read (the syncer keeps only the newest; a newer checkpoint replaced it); pull again"
        ) from None
    return checkpoint, files, chosen or Path(source.label).name


def write_out(
    out: Path, checkpoint: Checkpoint, files: dict[str, bytes], hf: bool = False, source_of: Path | None = None
) -> list[str]:
    """The checkpoint's files, its model config, the source of a model of yours (from the job directory ``source_of``)
    and (``hf``) a Hugging Face directory, into ``out``, whole or not at all."""
    if out.exists() and any(out.iterdir()):
        raise DdctlError(f"{out}: exists and is not empty; choose a new directory (nothing was written)")
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        (tmp / CONFIG).write_text(json.dumps(checkpoint.manifest.model, indent=1, sort_keys=True) + "\n")
        for name, text in pack(source_of / MODEL_DIR if source_of is not None else None).items():
            (tmp / MODEL_DIR / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / MODEL_DIR / name).write_text(text)
        if hf:
            from ddctl.export.hf import write_hf

            write_hf(checkpoint.params, from_json(ModelConfig, checkpoint.manifest.model), tmp / "hf")
        written = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return written


def resume_point(where: str, inner: InnerConfig) -> tuple[dict[str, bytes], dict[str, Any]]:
    """``up --resume-from``: the checkpoint's files, checked whole and against the new job's model, and what it is."""
    checkpoint, files, name = fetch(open_source(where), expect=model_shapes(inner), model=to_json(model_config(inner)))
    m = checkpoint.manifest
    info = {
        "from": where,
        "checkpoint": name,
        "run": m.run,
        "rounds": m.rounds,
        "val_bpb": m.val_bpb,
        "merged": m.tokens.get("merged", 0),
    }
    return files, info


def stage(files: dict[str, bytes], rundir: RunDir) -> None:
    """The resume checkpoint into the new run's job directory, where its syncer starts from it."""
    rundir.resume.mkdir(parents=True, exist_ok=True)
    for file, data in files.items():
        (rundir.resume / file).write_bytes(data)


def _remote_source(provider: Provider, syncer: Instance, kind: str) -> Source:
    """The checkpoints on the syncer's own machine, file by file over SSH."""
    root = f"{REMOTE_ROOT}/state/checkpoints"

    def read(name: str, limit: int) -> bytes:
        try:
            data = provider.read_file(syncer, f"{root}/{name}", limit)  # no further than its manifest says
        except TooLarge as exc:  # larger than any file read whole (``console.limit_of``): bad data, as below
            raise CheckpointError(f"{root}/{name}: {exc}") from None
        if data is None:
            raise FileNotFoundError(f"{root}/{name}")
        if len(data) > limit:
            raise CheckpointError(f"{root}/{name}: {len(data)} bytes, more than its manifest says ({limit})")
        return bytes(data)

    return Source(f"{kind} syncer:{root}", read)
