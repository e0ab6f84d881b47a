"""Objects by URL, for checkpoints and datasets: a local path, ``file://PATH``, ``s3://BUCKET/KEY`` or ``gs://BUCKET/KEY``.

Four verbs behind one dispatcher, one backend module each (``_local``, ``_s3``, ``_gcs``), and ``join``.
URLs are checked before any I/O (bucket names by each provider's rules, a KEY, no ``..``), and every
failure is a ``StorageError`` (an ``AgentError``) naming the URL, what went wrong and, for a malformed URL,
what is allowed; its ``kind`` ("missing", "too_large", "denied", "unreachable", ...) is what callers
switch on. SDK errors are translated in one place per backend and never surface. The cloud SDKs are
imported on first use; endpoints and credentials come from their usual environment variables.

    put("s3://ckpts/run1/step-100.pt", blob)           # local writes are atomic (tmp, fsync, rename)
    get("gs://data/shard-0001", max_bytes=1 << 30)     # refused before download when over the limit
    listing("s3://ckpts/run1")                          # every object under run1/, full URLs, sorted
"""

from __future__ import annotations

from typing import Protocol

from ddctl_agents.storage import _gcs, _local, _s3
from ddctl_agents.storage._location import Location, StorageError, join, parse

__all__ = ["StorageError", "check", "delete", "get", "is_remote", "join", "listing", "put"]


class _Backend(Protocol):
    def put(self, loc: Location, data: bytes) -> None: ...
    def get(self, loc: Location, max_bytes: int | None) -> bytes: ...
    def listing(self, loc: Location) -> list[str]: ...
    def delete(self, loc: Location) -> None: ...


_BACKENDS: dict[str, _Backend] = {"file": _local, "s3": _s3, "gs": _gcs}


def is_remote(url: str) -> bool:
    """Whether ``url`` names an object in a cloud bucket (s3:// or gs://) rather than a local file."""
    return url.startswith(("s3://", "gs://"))


def put(url: str, data: bytes) -> None:
    """Write ``data`` as the whole object at ``url``, replacing any; local parent directories are created."""
    loc = parse(url)
    _BACKENDS[loc.scheme].put(loc, data)


def get(url: str, max_bytes: int | None = None) -> bytes:
    """The object at ``url``; StorageError if it is missing or larger than ``max_bytes``."""
    if max_bytes is not None and max_bytes < 0:
        raise StorageError(url, f"max_bytes must be >= 0, not {max_bytes}", kind="malformed")
    loc = parse(url)
    return _BACKENDS[loc.scheme].get(loc, max_bytes)


def listing(prefix: str) -> list[str]:
    """Full URLs of every object under the "directory" ``prefix`` (recursively), sorted; [] when there is none."""
    loc = parse(prefix, prefix=True)
    return _BACKENDS[loc.scheme].listing(loc)


def delete(url: str) -> None:
    """Remove the object at ``url``; one already missing is fine (a missing bucket is not)."""
    loc = parse(url)
    _BACKENDS[loc.scheme].delete(loc)


def check(url: str, *, prefix: bool = True) -> None:
    """Refuse a malformed URL before anything is written to it (StorageError naming the allowed forms)."""
    parse(url, prefix=prefix)
