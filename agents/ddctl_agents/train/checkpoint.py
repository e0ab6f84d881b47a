"""A checkpoint of the global model: the merged fragments as safetensors, and a manifest that makes them checkable.

One checkpoint is a directory (or an object-storage prefix) named ``ckpt-<rounds>``:

- ``model.safetensors``: every parameter of the merged model, by its name in the model, fp32;
- ``outer.safetensors``: the outer Nesterov momentum of every parameter whose fragment has merged (a resumed run
  continues from it);
- ``manifest.json``, written last (a directory without one is not a checkpoint): the format, the run,
  rounds, fragment versions, vector clock, token books, each learner's step, val_bpb, the model and job
  configs, and each file's size and sha256.

Reading is all or nothing: the manifest is validated in type and range, every file's size and checksum
is checked before it is parsed, and the tensors must be exactly the model's (names, shapes, dtype,
finite); anything else raises ``CheckpointError`` with the reason, before a single value is used.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from ddctl_agents.errors import CheckpointError

FORMAT = "ddctl-checkpoint/1"
MANIFEST = "manifest.json"
MODEL = "model.safetensors"
OUTER = "outer.safetensors"
MAX_MANIFEST_BYTES = 1 << 20
MAX_FILE_BYTES = 1 << 40
"""What a checkpoint's files may claim to be (1 TiB), before any is fetched."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileEntry(_Strict):
    bytes: Annotated[int, Field(ge=0, le=MAX_FILE_BYTES)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Part(_Strict):
    """A shard's part of a global checkpoint (``service/cuts.py``): its fragments' tensors at checkpoint epoch ``cut``."""

    shard: Annotated[str, Field(pattern=r"^S[0-9]{1,3}$")]
    map_epoch: Annotated[int, Field(ge=1)]
    cut: Annotated[int, Field(ge=1)]
    fragments: list[Annotated[int, Field(ge=0)]]


class Manifest(_Strict):
    """What a checkpoint says about itself; every field is checked on the way in."""

    format: str
    run: Annotated[str, Field(max_length=200)]
    created_at: Annotated[float, Field(ge=0)]
    rounds: Annotated[int, Field(ge=0)]
    versions: list[Annotated[int, Field(ge=0)]]
    vclock: dict[str, Annotated[int, Field(ge=0)]]
    tokens: dict[str, Annotated[int, Field(ge=0)]]
    """The token books at the checkpoint (``ending.tokens``): merged, received, trained, ..."""
    steps: dict[str, Annotated[int, Field(ge=0)]]
    """Each learner's last reported step: a resumed run's learners continue their schedules from here."""
    val_bpb: Annotated[float, Field(ge=0)] | None
    model: dict[str, Any]
    """The ``ModelConfig`` as JSON: what the tensors must be the parameters of."""
    job: dict[str, Any]
    job_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    files: dict[str, FileEntry]
    part: Part | None = None
    """Set on one shard's part of a global checkpoint: not a whole model (``ddctl syncer checkpoint`` joins the parts)."""
    cut: Annotated[int, Field(ge=1)] | None = None
    """The checkpoint epoch of a global checkpoint joined from shards' parts."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    manifest: Manifest
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor] | None


def encode(
    params: Mapping[str, torch.Tensor], momentum: Mapping[str, torch.Tensor] | None, manifest: Mapping[str, Any]
) -> dict[str, bytes]:
    """The checkpoint's files, name -> bytes, the manifest (``manifest`` plus every file's size and sha256) last."""
    files = {MODEL: save_tensors({n: t.detach().float().contiguous() for n, t in sorted(params.items())})}
    if momentum:
        files[OUTER] = save_tensors({n: t.detach().float().contiguous() for n, t in sorted(momentum.items())})
    entries = {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
    body = {"format": FORMAT, **manifest, "files": entries}
    Manifest.model_validate(body)  # what we write must read back
    files[MANIFEST] = json.dumps(body, indent=1, sort_keys=True).encode()
    return files


def write_directory(final: Path, files: Mapping[str, bytes]) -> None:
    """A checkpoint's files into the new directory ``final``, whole or not at all: each fsynced into a hidden sibling
    in order (the manifest last, as ``encode`` returns it), then renamed into place."""
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for file, data in files.items():
            with (tmp / file).open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_manifest(data: bytes) -> Manifest:
    """The manifest's bytes, validated; CheckpointError naming the first problem."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise CheckpointError(f"{MANIFEST} is {len(data)} bytes; at most {MAX_MANIFEST_BYTES} are allowed")
    try:
        manifest = Manifest.model_validate_json(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "the document"
        raise CheckpointError(f"{MANIFEST}: {where}: {error['msg']}") from None
    if manifest.format != FORMAT:
        raise CheckpointError(f"{MANIFEST}: format {manifest.format!r} is not one this version reads ({FORMAT})")
    if MODEL not in manifest.files or not set(manifest.files) <= {MODEL, OUTER}:
        raise CheckpointError(f"{MANIFEST}: files must be {MODEL} and optionally {OUTER}, got {sorted(manifest.files)}")
    return manifest


def load(read: Callable[[str, int], bytes], shapes: Mapping[str, tuple[int, ...]] | None = None) -> Checkpoint:
    """A checkpoint through ``read(name, max_bytes)``, checked whole before it is returned.

    ``shapes``: the parameters the caller's model has (name -> shape); the checkpoint must hold exactly those."""
    manifest = read_manifest(read(MANIFEST, MAX_MANIFEST_BYTES))
    if manifest.part is not None and shapes is not None:
        raise CheckpointError(
            f"this is shard {manifest.part.shard}'s part of global checkpoint {manifest.part.cut} (fragments "
            f"{manifest.part.fragments}), not a whole model; ddctl syncer checkpoint joins the shards' parts into one"
        )
    tensors = {}
    for name, entry in manifest.files.items():
        data = read(name, entry.bytes)
        if len(data) != entry.bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise CheckpointError(f"{name}: its size or sha256 does not match the manifest's (a corrupted or partial copy)")
        try:
            tensors[name] = load_tensors(data)
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a malformed file
            raise CheckpointError(f"{name}: not a readable safetensors file ({type(exc).__name__})") from None
    params = tensors[MODEL]
    _check(MODEL, params, shapes if shapes is not None else {n: tuple(t.shape) for n, t in params.items()})
    momentum = tensors.get(OUTER)
    if momentum is not None:  # a fragment that never merged has no momentum yet: a subset of the parameters
        _check(OUTER, momentum, {n: tuple(t.shape) for n, t in params.items() if n in momentum})
        if not set(momentum) <= set(params):
            raise CheckpointError(f"{OUTER} names parameters the model has not: {sorted(set(momentum) - set(params))[:3]}")
    return Checkpoint(manifest, params, momentum)


def _check(what: str, tensors: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Exactly the expected names and shapes, fp32, finite: anything else is another model or a damaged file."""
    missing, extra = sorted(set(shapes) - set(tensors)), sorted(set(tensors) - set(shapes))
    if missing or extra:
        raise CheckpointError(
            f"{what} is not this model's: missing {missing[:3] or 'nothing'}, unexpected {extra[:3] or 'nothing'}"
        )
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(shapes[name]):
            raise CheckpointError(f"{what}: {name} has shape {tuple(tensor.shape)}; this model's is {tuple(shapes[name])}")
        if tensor.dtype != torch.float32:
            raise CheckpointError(f"{what}: {name} is {tensor.dtype}; checkpoints hold float32")
        # a sum is NaN or infinite whenever a value is (16x faster than a max); only then is each value looked at
        if not math.isfinite(float(tensor.sum())) and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{what}: {name} holds a non-finite value")


__all__ = ["FORMAT", "MANIFEST", "MODEL", "OUTER", "Checkpoint", "CheckpointError", "Manifest", "encode", "load", "read_manifest"]
