"""Pre-tokenised token shards: the on-disk format, its checks at the trust boundary, finding and writing shards.

The format is the common flat one, with one JSON sidecar per shard, side by side::

    NAME.bin    token ids as a flat little-endian array, uint16 or uint32, no header
    NAME.json   {"format": "ddctl-tokens", "dtype": "uint16", "vocab_size": 50257,
                 "count": 100000000, "sha256": "<hex digest of NAME.bin>", "text_bytes": 412345678}

``dtype`` is "uint16" or "uint32" (``ddctl data prepare`` picks uint16 when every id fits, i.e.
vocab_size <= 65536); ``count`` is the number of tokens, so the file has count x itemsize bytes;
``sha256`` covers NAME.bin; ``text_bytes`` (optional) is how many bytes of UTF-8 text those tokens
came from, which turns bits per token into bits per byte; other keys are ignored. A folder of
shards is every ``*.bin`` under it (hidden names skipped), in sorted order. A shard's name, which
orders it and decides the validation split, is its path relative to the folder's parent
(``shards/train_000.bin``), the same for a local folder and an object-storage prefix ending in
``shards/``.

Nothing is loaded whole: a local shard is read through a numpy memmap; a remote one (``s3://``,
``gs://``, through ``ddctl_agents.storage``) is first downloaded into a content-addressed cache.
Before a shard's tokens are used, its size, sha256 and largest id (checked in chunks) must agree
with the sidecar; otherwise a ConfigError names the file, what it holds and what is allowed.

Write small::

    writer = ShardWriter(Path("out"), vocab_size=512, shard_tokens=1000)
    writer.add(np.arange(2500) % 512, text_bytes=9000)
    writer.close()                                  # three shards: 1000, 1000 and 500 tokens
    shards = find_shards(("out",))                  # sidecars read; shards[0].tokens() memory-maps one

``ddctl_agents.train.data`` streams them to learners (``TokenStream``) and splits them.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from ddctl_agents.errors import ConfigError
from ddctl_agents.train.checksum import is_sha256

DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
"""Allowed token dtypes, always little-endian."""
FORMAT = "ddctl-tokens"
SIDECAR_MAX_BYTES = 64 * 2**10
"""A sidecar larger than this is refused unread: it is a few numbers."""
VERIFY_CHUNK = 16 * 2**20
"""Bytes read at a time when a shard's sha256 and largest id are checked."""


def dtype_for(vocab_size: int) -> str:
    """The narrowest allowed dtype that holds every id below vocab_size."""
    if not 2 <= vocab_size <= 2**32:
        raise ConfigError(f"vocab_size must be in [2, 2**32], got {vocab_size}")
    return "uint16" if vocab_size <= 2**16 else "uint32"


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardMeta:
    """What a shard's sidecar promises, and where the shard is."""

    name: str
    """Relative name: orders shards and decides the validation split."""
    location: str
    """Local path or URL of the .bin file."""
    dtype: str
    vocab_size: int
    count: int
    """Tokens in the shard."""
    sha256: str
    text_bytes: int | None = None
    """UTF-8 bytes of text the tokens came from, when known."""

    @property
    def nbytes(self) -> int:
        return self.count * DTYPES[self.dtype].itemsize


def sidecar_of(location: str) -> str:
    """NAME.bin -> NAME.json (a path or a URL)."""
    return location.removesuffix(".bin") + ".json"


def parse_sidecar(raw: bytes, *, name: str, location: str) -> ShardMeta:
    """A sidecar's JSON checked field by field; the error names the sidecar and what is allowed."""
    where = sidecar_of(location)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, an integer past 4300 digits
        raise ConfigError(f"{where}: not a JSON sidecar ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a sidecar is a JSON object with dtype, vocab_size, count and sha256")
    dtype, vocab, count, sha, text = (data.get(k) for k in ("dtype", "vocab_size", "count", "sha256", "text_bytes"))
    if dtype not in DTYPES:
        raise ConfigError(f"{where}: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not isinstance(vocab, int) or not 2 <= vocab <= np.iinfo(DTYPES[dtype]).max + 1:
        raise ConfigError(
            f"{where}: vocab_size must be an integer in [2, {np.iinfo(DTYPES[dtype]).max + 1}] for {dtype}, got {vocab!r}"
        )
    if not isinstance(count, int) or count < 1:
        raise ConfigError(f"{where}: count must be an integer >= 1 (tokens in the shard), got {count!r}")
    if not is_sha256(sha):
        raise ConfigError(f"{where}: sha256 must be 64 lowercase hex digits, got {sha!r}")
    if text is not None and (not isinstance(text, int) or text < 0):
        raise ConfigError(f"{where}: text_bytes must be an integer >= 0 when given, got {text!r}")
    return ShardMeta(name=name, location=location, dtype=dtype, vocab_size=vocab, count=count, sha256=sha, text_bytes=text)


def verify_shard(path: Path, meta: ShardMeta) -> None:
    """Refuse a shard whose size, sha256 or largest id disagrees with its sidecar (one chunked pass)."""
    size = path.stat().st_size
    if size != meta.nbytes:
        raise ConfigError(
            f"{meta.location}: {size} bytes, but its sidecar promises count x itemsize = "
            f"{meta.count} x {DTYPES[meta.dtype].itemsize} = {meta.nbytes} ({meta.dtype})"
        )
    digest, largest = hashlib.sha256(), 0
    step = VERIFY_CHUNK - VERIFY_CHUNK % DTYPES[meta.dtype].itemsize
    with path.open("rb") as file:
        while chunk := file.read(step):
            digest.update(chunk)
            largest = max(largest, int(np.frombuffer(chunk, dtype=DTYPES[meta.dtype]).max()))
    if digest.hexdigest() != meta.sha256:
        raise ConfigError(f"{meta.location}: sha256 {digest.hexdigest()} differs from its sidecar's {meta.sha256}")
    if largest >= meta.vocab_size:
        raise ConfigError(f"{meta.location}: holds token id {largest}; ids must be below vocab_size={meta.vocab_size}")


class Shard:
    """One shard: its sidecar's promises, and its tokens once fetched, verified and memory-mapped."""

    def __init__(self, meta: ShardMeta, fetch: Callable[[ShardMeta], Path]) -> None:
        self.meta = meta
        self._fetch = fetch
        self._tokens: np.ndarray[Any, Any] | None = None

    def tokens(self) -> np.ndarray[Any, Any]:
        """The shard's ids as a read-only memmap; the first call fetches and verifies it."""
        if self._tokens is None:
            path = self._fetch(self.meta)
            try:
                verify_shard(path, self.meta)
            except ConfigError:
                if str(path) != self.meta.location:  # a bad cached download: fetched afresh next time
                    path.unlink(missing_ok=True)
                raise
            self._tokens = np.memmap(path, dtype=DTYPES[self.meta.dtype], mode="r", shape=(self.meta.count,))
        return self._tokens

    def __repr__(self) -> str:
        return f"Shard({self.meta.name!r}, {self.meta.count} tokens)"


class Storage(Protocol):
    """The part of ``ddctl_agents.storage`` that reading remote shards needs (tests inject a fake)."""

    def get(self, url: str, max_bytes: int | None = None) -> bytes: ...

    def listing(self, prefix: str) -> list[str]: ...


def is_remote(path: str) -> bool:
    """A URL (``s3://``, ``gs://``, ``file://``: read through ``ddctl_agents.storage``) rather than a local path."""
    return "://" in path


def default_storage() -> Storage:
    try:
        return cast(Storage, importlib.import_module("ddctl_agents.storage"))
    except ImportError as exc:
        raise ConfigError(f"remote token shards need object storage support (ddctl_agents.storage): {exc}") from None


def default_cache() -> Path:
    return Path(tempfile.gettempdir()) / "ddctl-token-cache"


def _local(path: Path, name: str) -> Shard:
    sidecar = Path(sidecar_of(str(path)))
    if not sidecar.is_file():
        raise ConfigError(f"token shard {path} has no sidecar {sidecar} (dtype, vocab_size, count, sha256)")
    if sidecar.stat().st_size > SIDECAR_MAX_BYTES:
        raise ConfigError(f"{sidecar}: over {SIDECAR_MAX_BYTES} bytes; a sidecar holds a few numbers")
    meta = parse_sidecar(sidecar.read_bytes(), name=name, location=str(path))
    if path.stat().st_size != meta.nbytes:
        raise ConfigError(
            f"{path}: {path.stat().st_size} bytes, but its sidecar promises {meta.count} {meta.dtype} = {meta.nbytes}"
        )
    return Shard(meta, lambda m: Path(m.location))


def _local_shards(given: Path) -> list[Shard]:
    if given.is_file():
        if given.suffix != ".bin":
            raise ConfigError(f"token shards are *.bin files with a NAME.json sidecar; got {given}")
        return [_local(given, given.name)]
    if not given.is_dir():
        raise ConfigError(f"token path {given} does not exist")
    found = []
    for folder, dirs, names in os.walk(given):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(folder, n) for n in names if n.endswith(".bin") and not n.startswith(".")]
    if not found:
        raise ConfigError(f"no *.bin token shards under {given}")
    return [_local(p, (Path(given.name) / p.relative_to(given)).as_posix()) for p in found]


def _download(storage: Storage, cache: Path) -> Callable[[ShardMeta], Path]:
    """A fetch that fills a content-addressed cache (files named by sha256), verified on opening."""

    def fetch(meta: ShardMeta) -> Path:
        target = cache / f"{meta.sha256}.bin"
        if target.is_file() and target.stat().st_size == meta.nbytes:
            return target
        cache.mkdir(parents=True, exist_ok=True)
        data = storage.get(meta.location, max_bytes=meta.nbytes)
        if hashlib.sha256(data).hexdigest() != meta.sha256:
            raise ConfigError(f"{meta.location}: downloaded {len(data)} bytes whose sha256 differs from its sidecar's")
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".part")
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp, target)
        return target

    return fetch


def _url_of(entry: str, prefix: str) -> str:
    """A listing entry as a URL: entries are URLs, or keys from the bucket's root."""
    if is_remote(entry):
        return entry
    scheme, _, rest = prefix.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}/{entry.lstrip('/')}"


def _remote_shards(url: str, storage: Storage, cache: Path) -> list[Shard]:
    if url.endswith(".bin"):
        located = [(url, url.rsplit("/", 1)[-1])]
    else:
        root = url.rstrip("/") + "/"
        base = root.rstrip("/").rsplit("/", 1)[-1]
        bins = sorted(u for u in (_url_of(e, url) for e in storage.listing(root)) if u.endswith(".bin"))
        located = [(u, f"{base}/{u.removeprefix(root)}") for u in bins if u.startswith(root)]
        if not located:
            raise ConfigError(f"no *.bin token shards under {url}")
    fetch = _download(storage, cache)
    shards = []
    for location, name in located:
        raw = storage.get(sidecar_of(location), max_bytes=SIDECAR_MAX_BYTES)
        shards.append(Shard(parse_sidecar(raw, name=name, location=location), fetch))
    return shards


def find_shards(paths: Sequence[str], *, storage: Storage | None = None, cache: Path | None = None) -> list[Shard]:
    """Every shard under paths, sorted by name, sidecars read and checked; no token is read yet.

    All shards must share one vocab_size; a shard given twice counts once.
    """
    shards: dict[str, Shard] = {}
    for path in paths:
        if is_remote(path):
            found = _remote_shards(path, storage or default_storage(), cache or default_cache())
        else:
            found = _local_shards(Path(path))
        for shard in found:
            key = shard.meta.location if is_remote(shard.meta.location) else str(Path(shard.meta.location).resolve())
            shards.setdefault(key, shard)
    ordered = sorted(shards.values(), key=lambda s: (s.meta.name, s.meta.location))
    if not ordered:
        raise ConfigError("no token shards given")
    first = ordered[0].meta
    for shard in ordered:
        if shard.meta.vocab_size != first.vocab_size:
            raise ConfigError(
                f"token shards disagree on vocab_size: {first.location} has {first.vocab_size}, "
                f"{shard.meta.location} has {shard.meta.vocab_size}; one dataset has one tokenizer"
            )
    return ordered


class ShardWriter:
    """Writes ids into ``folder`` as shards of ``shard_tokens`` (the last one shorter), sidecars included.

    Streams to disk: memory holds one added chunk, never a shard.
    """

    def __init__(self, folder: Path, *, vocab_size: int, shard_tokens: int, prefix: str = "tokens") -> None:
        if shard_tokens < 1:
            raise ConfigError(f"shard_tokens must be >= 1, got {shard_tokens}")
        self.folder, self.vocab_size, self.shard_tokens, self.prefix = folder, vocab_size, shard_tokens, prefix
        self.dtype = dtype_for(vocab_size)
        self.written: list[ShardMeta] = []
        self._file: Any = None
        self._digest = hashlib.sha256()
        self._count = 0
        self._text = 0.0

    def add(self, ids: Sequence[int] | np.ndarray[Any, Any], *, text_bytes: int = 0) -> None:
        """Append ids (their text's bytes are shared out in proportion where they straddle two shards)."""
        array = np.asarray(ids, dtype=np.int64)
        if not len(array):
            self._text += text_bytes  # text without tokens: its bytes count with the next ones
            return
        if array.min() < 0 or array.max() >= self.vocab_size:
            raise ConfigError(f"token ids must be in [0, {self.vocab_size}); got {int(array.min())}..{int(array.max())}")
        array, at = array.astype(DTYPES[self.dtype]), 0
        while at < len(array):
            if self._file is None:
                self._file = (self.folder / f"{self.prefix}_{len(self.written):06d}.bin").open("wb")
            take = min(len(array) - at, self.shard_tokens - self._count)
            piece = array[at : at + take].tobytes()
            self._file.write(piece)
            self._digest.update(piece)
            self._count += take
            self._text += text_bytes * take / len(array)
            at += take
            if self._count == self.shard_tokens:
                self._finish()

    def close(self) -> list[ShardMeta]:
        """Finish the last shard; the metadata of every shard written."""
        if self._file is not None:
            self._finish()
        return self.written

    def _finish(self) -> None:
        self._file.close()
        text_before = sum(m.text_bytes or 0 for m in self.written)
        meta = ShardMeta(
            name=Path(self._file.name).name,
            location=self._file.name,
            dtype=self.dtype,
            vocab_size=self.vocab_size,
            count=self._count,
            sha256=self._digest.hexdigest(),
            text_bytes=round(self._text) - text_before,
        )
        sidecar = {k: getattr(meta, k) for k in ("dtype", "vocab_size", "count", "sha256", "text_bytes")}
        Path(sidecar_of(meta.location)).write_text(json.dumps({"format": FORMAT, **sidecar}, indent=1) + "\n")
        self.written.append(meta)
        self._file, self._digest, self._count = None, hashlib.sha256(), 0


__all__ = [
    "DTYPES",
    "Shard",
    "ShardMeta",
    "ShardWriter",
    "Storage",
    "dtype_for",
    "find_shards",
    "is_remote",
    "parse_sidecar",
    "verify_shard",
]
