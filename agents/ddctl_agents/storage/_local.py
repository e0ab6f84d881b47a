"""Local files behind the object API: what a single-host run and the tests use.

A write is atomic (temporary file, fsync, rename, fsync of the directory), so a reader never sees a
half-written checkpoint and a crash leaves either the old object or the new one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ddctl_agents.storage._location import Location, StorageError, join

_TMP = ".storage-tmp"  # suffix of a write in progress; listings skip it


@contextlib.contextmanager
def _errors(loc: Location, doing: str) -> Iterator[None]:
    """OSError → StorageError with the strerror only (no traceback, no errno noise)."""
    try:
        yield
    except FileNotFoundError:
        raise StorageError(loc.url, "no such object", kind="missing") from None
    except IsADirectoryError:
        raise StorageError(loc.url, f"cannot {doing}: it is a directory, not an object", kind="malformed") from None
    except PermissionError:
        raise StorageError(loc.url, f"cannot {doing}: permission denied", kind="denied") from None
    except OSError as exc:
        raise StorageError(loc.url, f"cannot {doing}: {exc.strerror or exc}") from None


def put(loc: Location, data: bytes) -> None:
    path = Path(loc.key)
    with _errors(loc, "write"):
        if path.is_dir():
            raise IsADirectoryError(str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TMP)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    """Make the rename itself durable (best effort: some filesystems refuse to open a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def get(loc: Location, max_bytes: int | None) -> bytes:
    with _errors(loc, "read"), open(loc.key, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if max_bytes is not None and size > max_bytes:
            raise _too_large(loc, size, max_bytes)
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:  # it grew while we read
        raise _too_large(loc, len(data), max_bytes)
    return data


def _too_large(loc: Location, size: int, max_bytes: int) -> StorageError:
    return StorageError(loc.url, f"the object is {size} bytes, over the limit of {max_bytes}", kind="too_large")


def listing(loc: Location) -> list[str]:
    root = Path(loc.key)
    if not root.is_dir():
        return []
    found: list[str] = []
    with _errors(loc, "list"):
        for here, _, files in os.walk(root):
            rel = Path(here).relative_to(root)
            found += [join(loc.url, (rel / f).as_posix()) for f in files if not f.endswith(_TMP)]
    return sorted(found)


def delete(loc: Location) -> None:
    with _errors(loc, "delete"), contextlib.suppress(FileNotFoundError):
        os.unlink(loc.key)
