"""Byte corpora, the train/validation split, learner shards and batches.

Everything here is a pure function of its inputs so that any learner can be
replayed: the split depends only on file names, a shard only on (learner,
learners), and a batch only on (seed, stream, step).

Run small::

    corpus = load_corpus(DataConfig(max_bytes=1 << 20))   # the stdlib's own .py files
    x, y = BatchSampler(shard(corpus.train, 0, 2), 8, 128, seed=0, stream=0).batch(0)
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ddctl_agents.train.config import ConfigError, DataConfig, require

MAX_FILE_BYTES = 64 * 2**20
"""User files larger than this are skipped: they are usually data dumps, not text."""

SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
"""Folders of the stdlib tree that hold installed packages or caches, not the stdlib."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Corpus:
    """The bytes a run trains and validates on, with enough identity to reproduce it."""

    train: Tensor
    """1-D uint8 training bytes (files concatenated in sorted order)."""
    val: Tensor
    """1-D uint8 held-out bytes."""
    files: int
    """Number of files read (train and validation)."""
    val_files: tuple[str, ...]
    """Relative paths of the held-out files; empty when the byte fallback split was used."""
    sha256: str
    """Digest over each file's relative path and bytes, in reading order."""
    source: str
    """Where the bytes came from, for logs: 'stdlib:<dir>' or 'paths:<p1>,<p2>'."""


def in_validation(rel_path: str, val_fraction: float) -> bool:
    """Stable hash bucket of a file's relative path: same answer on every machine and run."""
    return zlib.crc32(rel_path.encode()) / 2**32 < val_fraction


def _walk(root: Path, suffix: str) -> Iterator[Path]:
    """Regular files under root ending in suffix, skipping hidden names and SKIP_DIRS."""
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS]
        for name in names:
            path = Path(folder, name)
            if not name.startswith(".") and name.endswith(suffix) and path.is_file():
                yield path


def _stdlib_files() -> tuple[str, list[tuple[str, Path]]]:
    """The running interpreter's standard library .py files, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((path.relative_to(root).as_posix(), path) for path in _walk(root, ".py"))
    return f"stdlib:{root}", files


def _user_files(paths: tuple[Path, ...]) -> tuple[str, list[tuple[str, Path]]]:
    """Given files and folders (recursively), each folder's files sorted; duplicates once."""
    files: list[tuple[str, Path]] = []
    seen: set[Path] = set()
    for given in paths:
        if not given.exists():
            raise ConfigError(f"data path {given} does not exist")
        if given.is_file():
            found = [(given.name, given)]
        else:
            found = sorted(((Path(given.name) / p.relative_to(given)).as_posix(), p) for p in _walk(given, ""))
        for rel, path in found:
            if path.resolve() not in seen and path.stat().st_size <= MAX_FILE_BYTES:
                seen.add(path.resolve())
                files.append((rel, path))
    return "paths:" + ",".join(str(p) for p in paths), files


def _read(files: list[tuple[str, Path]], max_bytes: int) -> list[tuple[str, bytes]]:
    """File contents in order until max_bytes in total (the last one truncated)."""
    out: list[tuple[str, bytes]] = []
    left = max_bytes
    for rel, path in files:
        if left <= 0:
            break
        content = path.read_bytes()[:left]
        if content:
            out.append((rel, content))
            left -= len(content)
    return out


def _as_tensor(chunks: list[bytes]) -> Tensor:
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


def load_corpus(config: DataConfig) -> Corpus:
    """Read the corpus and split it by file; both splits are guaranteed non-empty.

    A file is held out iff its relative path hashes into the val_fraction
    bucket. If that leaves either side empty (few files), the last val_fraction
    of all bytes becomes validation instead.
    """
    source, files = _user_files(config.paths) if config.paths else _stdlib_files()
    contents = _read(files, config.max_bytes)
    total = sum(len(c) for _, c in contents)
    require(total >= 2, f"no data read from {source} (got {total} bytes; need at least 2)")
    digest = hashlib.sha256()
    for rel, content in contents:
        digest.update(rel.encode() + b"\0" + len(content).to_bytes(8, "little"))
        digest.update(content)
    held_out = [in_validation(rel, config.val_fraction) for rel, _ in contents]
    val_files: tuple[str, ...]
    if all(held_out) or not any(held_out):
        data = _as_tensor([c for _, c in contents])
        cut = len(data) - max(1, int(len(data) * config.val_fraction))
        train, val, val_files = data[:cut], data[cut:], ()
    else:
        train = _as_tensor([c for (_, c), v in zip(contents, held_out, strict=True) if not v])
        val = _as_tensor([c for (_, c), v in zip(contents, held_out, strict=True) if v])
        val_files = tuple(rel for (rel, _), v in zip(contents, held_out, strict=True) if v)
    return Corpus(
        train=train,
        val=val,
        files=len(contents),
        val_files=val_files,
        sha256=digest.hexdigest(),
        source=source,
    )


SHARD_BLOCK = 64 * 2**10
"""Shards interleave blocks of this many bytes, so every learner sees the whole mix."""


def shard(train: Tensor, learner: int, learners: int, block: int = SHARD_BLOCK) -> Tensor:
    """Learner's disjoint share: blocks learner, learner+M, learner+2M, ... of the stream.

    Interleaving (not one contiguous slice each) keeps shards statistically alike:
    the stdlib sorted by path would otherwise give each learner different modules,
    a non-IID split that real learners drawing from one data mix do not have.
    All shards are equal; a remainder shorter than M blocks (or M bytes) is unused.
    """
    require(learners >= 1, f"learners must be >= 1, got {learners}")
    require(0 <= learner < learners, f"learner must be in [0, {learners}), got {learner}")
    block = max(1, min(block, len(train) // learners))
    rows = len(train) // (block * learners)
    blocks = train[: rows * block * learners].reshape(rows, learners, block)
    return blocks[:, learner, :].reshape(-1)


def _windows(data: Tensor, starts: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """Inputs and next-byte targets for windows of seq_len + 1 bytes at starts."""
    chunk = data[starts.unsqueeze(1) + torch.arange(seq_len + 1)].long()
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def _require_window(data: Tensor, seq_len: int, what: str) -> None:
    require(
        len(data) > seq_len,
        f"{what} has {len(data)} bytes; seq_len={seq_len} needs at least {seq_len + 1}",
    )


class BatchSampler:
    """Random training windows where batch(step) is a pure function of its arguments.

    Offsets come from a generator seeded by (seed, stream, step), so a replay can
    jump to any step, and learners with different streams see different windows.
    """

    def __init__(self, data: Tensor, batch_size: int, seq_len: int, seed: int, stream: int) -> None:
        _require_window(data, seq_len, "training data")
        require(batch_size >= 1, f"batch_size must be >= 1, got {batch_size}")
        self.data = data
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.stream = stream

    def batch(self, step: int) -> tuple[Tensor, Tensor]:
        """(x, y) int64 of shape (batch_size, seq_len), y being x shifted by one byte."""
        key = hashlib.blake2b(f"{self.seed}:{self.stream}:{step}".encode(), digest_size=8).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(key, "little") >> 1)
        high = len(self.data) - self.seq_len
        starts = torch.randint(0, high, (self.batch_size,), generator=generator)
        return _windows(self.data, starts, self.seq_len)


def validation_batches(val: Tensor, seq_len: int, windows: int, batch_size: int) -> list[tuple[Tensor, Tensor]]:
    """Evenly spaced held-out windows, batched: the same bytes for every evaluation."""
    _require_window(val, seq_len, "validation data")
    require(windows >= 1, f"windows must be >= 1, got {windows}")
    require(batch_size >= 1, f"batch_size must be >= 1, got {batch_size}")
    starts = torch.linspace(0, len(val) - seq_len - 1, windows).round().long()
    return [_windows(val, part, seq_len) for part in torch.split(starts, batch_size)]


__all__ = [
    "MAX_FILE_BYTES",
    "BatchSampler",
    "Corpus",
    "in_validation",
    "load_corpus",
    "shard",
    "validation_batches",
]
