"""Corpora (text as bytes, or pre-tokenised shards), the train/validation split, learner shards and batches.

Everything here is a pure function of its inputs so that any learner can be
replayed: the split depends only on file (or shard) names, a shard only on
(learner, learners), and a batch only on (seed, stream, step).

Text is a uint8 Tensor; token shards (``DataConfig.token_paths``, format in
``ddctl_agents.train.tokens``) are a ``TokenStream`` over memory-mapped shards,
which ``shard``, ``BatchSampler`` and ``validation_batches`` take alike. A
``Corpus`` says its ``vocab_size`` (256 for bytes): the model's must equal it
(``require_vocab``).

Run small::

    corpus = load_corpus(DataConfig(max_bytes=1 << 20))   # the stdlib's own .py files
    x, y = BatchSampler(shard(corpus.train, 0, 2), 8, 128, seed=0, stream=0).batch(0)
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import Tensor

from ddctl_agents.train.config import ConfigError, DataConfig, require
from ddctl_agents.train.tokens import Shard, Storage, find_shards

MAX_FILE_BYTES = 64 * 2**20
"""User files larger than this are skipped: they are usually data dumps, not text."""

SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
"""Folders of the stdlib tree that hold installed packages or caches, not the stdlib."""

BYTE_VOCAB = 256
"""A text corpus's vocabulary: its ids are bytes."""


@dataclass(frozen=True, slots=True)
class Span:
    """Tokens [start, stop) of one shard."""

    shard: Shard
    start: int
    stop: int


class TokenStream:
    """A read-only run of tokens over spans of shards; what a byte Tensor is for text.

    Supports ``len`` and ``windows``; slicing and sharing keep the spans, so nothing is read
    until a window is, and then only from the shards it touches.
    """

    def __init__(self, spans: Sequence[Span]) -> None:
        self.spans = tuple(s for s in spans if s.stop > s.start)
        self.offsets = np.cumsum([0] + [s.stop - s.start for s in self.spans])

    @classmethod
    def whole(cls, shards: Sequence[Shard]) -> TokenStream:
        return cls([Span(s, 0, s.meta.count) for s in shards])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def shards(self) -> list[Shard]:
        return list({id(s.shard): s.shard for s in self.spans}.values())

    def slice(self, start: int, stop: int) -> TokenStream:
        """Tokens [start, stop) of this stream, as spans."""
        start, stop = max(0, start), min(len(self), stop)
        spans = []
        for span, begin in zip(self.spans, self.offsets[:-1].tolist(), strict=True):
            lo, hi = max(start, begin), min(stop, begin + span.stop - span.start)
            if lo < hi:
                spans.append(Span(span.shard, span.start + lo - begin, span.start + hi - begin))
        return TokenStream(spans)

    def share(self, learner: int, learners: int, block: int) -> TokenStream:
        """Learner's disjoint share: whole spans round robin when there are at least ``learners``
        (each learner then reads, and downloads, only its own shards), else blocks interleaved
        like a byte stream's (block b goes to learner b mod learners; a remainder is unused)."""
        if len(self.spans) >= learners:
            return TokenStream(self.spans[learner::learners])
        block = max(1, min(block, len(self) // learners))
        rows = len(self) // (block * learners)
        pieces = [self.slice((r * learners + learner) * block, (r * learners + learner + 1) * block) for r in range(rows)]
        return TokenStream([span for piece in pieces for span in piece.spans])

    def windows(self, starts: Tensor, length: int) -> Tensor:
        """int64 (len(starts), length): the tokens from each start on, across span boundaries."""
        out = np.empty((len(starts), length), dtype=np.int64)
        for row, start in enumerate(starts.tolist()):
            if not 0 <= start <= len(self) - length:
                raise IndexError(f"window [{start}, {start + length}) outside a stream of {len(self)} tokens")
            filled = 0
            while filled < length:
                at = start + filled
                i = int(np.searchsorted(self.offsets, at, side="right")) - 1
                span = self.spans[i]
                local = span.start + at - int(self.offsets[i])
                take = min(length - filled, span.stop - local)
                out[row, filled : filled + take] = span.shard.tokens()[local : local + take]
                filled += take
        return torch.from_numpy(out)

    def bytes_per_token(self) -> float | None:
        """Mean UTF-8 bytes of text per token over the spans, when every shard's sidecar says it."""
        if any(s.shard.meta.text_bytes is None for s in self.spans) or not len(self):
            return None
        text = sum((s.stop - s.start) * cast(int, s.shard.meta.text_bytes) / s.shard.meta.count for s in self.spans)
        return text / len(self)


Tokens = Tensor | TokenStream
"""What a corpus split holds: uint8 bytes of text, or token ids in shards."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Corpus:
    """The bytes (or tokens) a run trains and validates on, with enough identity to reproduce it."""

    train: Tokens
    """1-D uint8 training bytes (files concatenated in sorted order), or the training shards' tokens."""
    val: Tokens
    """1-D uint8 held-out bytes, or the held-out tokens."""
    files: int
    """Number of files (or token shards) read (train and validation)."""
    val_files: tuple[str, ...]
    """Relative names of the held-out files or shards; empty when the tail fallback split was used."""
    sha256: str
    """Digest over each file's relative path and bytes, in reading order (shards: name, count, sha256)."""
    source: str
    """Where the data came from, for logs: 'stdlib:<dir>', 'paths:<p1>,<p2>' or 'tokens:<p1>,<p2>'."""
    vocab_size: int = BYTE_VOCAB
    """Every id is below this: 256 for bytes, the sidecars' vocab_size for token shards."""
    val_bytes_per_token: float | None = 1.0
    """UTF-8 text bytes per validation token (1 for bytes; None when sidecars do not say): bits per
    token divided by this is bits per byte."""


def in_validation(rel_path: str, val_fraction: float) -> bool:
    """Stable hash bucket of a file's relative path: same answer on every machine and run."""
    return zlib.crc32(rel_path.encode()) / 2**32 < val_fraction


def held_out_by_name(names: Sequence[str], val_fraction: float) -> list[bool] | None:
    """Which files (or shards) validation holds out, by ``in_validation``; None when that would leave either side
    empty (one file, say): then the last ``val_fraction`` of the whole (``tail_cut``) is held out instead."""
    held_out = [in_validation(name, val_fraction) for name in names]
    return None if all(held_out) or not any(held_out) else held_out


def tail_cut(length: int, val_fraction: float) -> int:
    """Where the held-out tail of ``length`` items starts: at least one item is held out."""
    return length - max(1, int(length * val_fraction))


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


def load_corpus(config: DataConfig, *, storage: Storage | None = None, cache: Path | None = None) -> Corpus:
    """Read the corpus and split it by file; both splits are guaranteed non-empty.

    A file is held out iff its relative path hashes into the val_fraction
    bucket. If that leaves either side empty (few files), the last val_fraction
    of all bytes becomes validation instead. Token shards split the same way by
    name (``_load_tokens``); ``storage`` and ``cache`` serve remote ones (default:
    ``ddctl_agents.storage`` and a cache under the temp dir).
    """
    if config.token_paths:
        return _load_tokens(config, find_shards(config.token_paths, storage=storage, cache=cache))
    source, files = _user_files(config.paths) if config.paths else _stdlib_files()
    contents = _read(files, config.max_bytes)
    total = sum(len(c) for _, c in contents)
    require(total >= 2, f"no data read from {source} (got {total} bytes; need at least 2)")
    digest = hashlib.sha256()
    for rel, content in contents:
        digest.update(rel.encode() + b"\0" + len(content).to_bytes(8, "little"))
        digest.update(content)
    held_out = held_out_by_name([rel for rel, _ in contents], config.val_fraction)
    val_files: tuple[str, ...]
    if held_out is None:
        data = _as_tensor([c for _, c in contents])
        cut = tail_cut(len(data), config.val_fraction)
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


def _load_tokens(config: DataConfig, shards: Sequence[Shard]) -> Corpus:
    """Token shards split like files: a shard is held out iff its name hashes into the val_fraction
    bucket; if that leaves either side empty (e.g. one shard), the last val_fraction of all tokens.
    Sidecars only are read here; tokens are verified and read when a window first needs them."""
    held_out = held_out_by_name([s.meta.name for s in shards], config.val_fraction)
    val_files: tuple[str, ...] = ()
    if held_out is None:
        whole = TokenStream.whole(shards)
        cut = tail_cut(len(whole), config.val_fraction)
        train, val = whole.slice(0, cut), whole.slice(cut, len(whole))
    else:
        train = TokenStream.whole([s for s, v in zip(shards, held_out, strict=True) if not v])
        val = TokenStream.whole([s for s, v in zip(shards, held_out, strict=True) if v])
        val_files = tuple(s.meta.name for s, v in zip(shards, held_out, strict=True) if v)
    require(len(train) >= 1 and len(val) >= 1, f"token shards {', '.join(config.token_paths)} hold too few tokens to split")
    digest = hashlib.sha256()
    for s in shards:
        digest.update(f"{s.meta.name}\0{s.meta.count}\0{s.meta.sha256}\n".encode())
    return Corpus(
        train=train,
        val=val,
        files=len(shards),
        val_files=val_files,
        sha256=digest.hexdigest(),
        source="tokens:" + ",".join(config.token_paths),
        vocab_size=shards[0].meta.vocab_size,
        val_bytes_per_token=val.bytes_per_token(),
    )


def dataset_vocab_size(config: DataConfig, *, storage: Storage | None = None) -> int:
    """The vocabulary the data needs, from sidecars alone (no token read): for a check before any loading."""
    return find_shards(config.token_paths, storage=storage)[0].meta.vocab_size if config.token_paths else BYTE_VOCAB


def require_vocab(corpus: Corpus, model_vocab_size: int) -> None:
    """The model must have exactly the data's vocabulary; a ConfigError says both and the fix."""
    require(
        model_vocab_size == corpus.vocab_size,
        f"the model's vocab_size is {model_vocab_size} but the data ({corpus.source}) has vocab_size "
        f"{corpus.vocab_size}; use a model with vocab_size={corpus.vocab_size}, or data made with its tokenizer",
    )


SHARD_BLOCK = 64 * 2**10
"""Shards interleave blocks of this many bytes (tokens), so every learner sees the whole mix."""


def shard(train: Tokens, learner: int, learners: int, block: int = SHARD_BLOCK) -> Tokens:
    """Learner's disjoint share: blocks learner, learner+M, learner+2M, ... of the stream.

    Interleaving (not one contiguous slice each) keeps shards statistically alike:
    the stdlib sorted by path would otherwise give each learner different modules,
    a non-IID split that real learners drawing from one data mix do not have.
    All shards are equal; a remainder shorter than M blocks (or M bytes) is unused.
    Token shards: whole shards round robin when there are at least M (``TokenStream.share``).
    """
    require(learners >= 1, f"learners must be >= 1, got {learners}")
    require(0 <= learner < learners, f"learner must be in [0, {learners}), got {learner}")
    if isinstance(train, TokenStream):
        return train.share(learner, learners, block)
    block = max(1, min(block, len(train) // learners))
    rows = len(train) // (block * learners)
    blocks = train[: rows * block * learners].reshape(rows, learners, block)
    return blocks[:, learner, :].reshape(-1)


def _windows(data: Tokens, starts: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """Inputs and next-token targets for windows of seq_len + 1 bytes (tokens) at starts."""
    if isinstance(data, TokenStream):
        chunk = data.windows(starts, seq_len + 1)
    else:
        chunk = data[starts.unsqueeze(1) + torch.arange(seq_len + 1)].long()
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def _require_window(data: Tokens, seq_len: int, what: str) -> None:
    require(
        len(data) > seq_len,
        f"{what} has {len(data)} bytes; seq_len={seq_len} needs at least {seq_len + 1}",
    )


class BatchSampler:
    """Random training windows where batch(step) is a pure function of its arguments.

    Offsets come from a generator seeded by (seed, stream, step), so a replay can
    jump to any step, and learners with different streams see different windows.
    """

    def __init__(self, data: Tokens, batch_size: int, seq_len: int, seed: int, stream: int) -> None:
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


def validation_batches(val: Tokens, seq_len: int, windows: int, batch_size: int) -> list[tuple[Tensor, Tensor]]:
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
    "TokenStream",
    "Tokens",
    "dataset_vocab_size",
    "in_validation",
    "load_corpus",
    "require_vocab",
    "shard",
    "validation_batches",
]
