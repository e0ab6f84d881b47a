"""What a storage URL means, checked before any I/O: one parser, one error, one join.

Every backend receives a ``Location`` that is already valid, so a malformed URL is refused the same way
whichever backend it was meant for, and never reaches an SDK (whose own messages are less helpful).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ddctl_agents.errors import AgentError

FORMS = "a local path, file://PATH, s3://BUCKET/KEY or gs://BUCKET/KEY"
"""The URL forms every storage function accepts (quoted in each refusal)."""

Problem = Literal["malformed", "missing", "no_bucket", "too_large", "denied", "unreachable", "failed"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_S3_RULE = "3-63 lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit"
_GCS_RULE = (
    "3-63 lowercase letters, digits, hyphens, underscores and dots (up to 222 with dots, 63 between dots), "
    "starting and ending with a letter or digit, not starting with 'goog' nor containing 'google'"
)
_S3_RESERVED = (("xn--", "sthree-", "amzn-s3-demo-"), ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"))
_MAX_KEY_BYTES = 1024  # both S3 and GCS


class StorageError(AgentError):
    """An object could not be read, written, listed or deleted; the message names the URL and why.

    ``kind`` says what went wrong without parsing the message: ``malformed`` (the URL itself),
    ``missing`` (no such object), ``no_bucket``, ``too_large`` (over ``max_bytes``), ``denied`` (no usable
    credentials, or they may not do this), ``unreachable`` (no connection: worth retrying later) or
    ``failed`` (anything else).
    """

    def __init__(self, url: str, reason: str, *, kind: Problem = "failed") -> None:
        super().__init__(f"{url}: {reason}")
        self.url, self.reason, self.kind = url, reason, kind


@dataclass(frozen=True, slots=True, kw_only=True)
class Location:
    """A checked URL, split for the backend that serves it."""

    url: str
    """As the caller wrote it (error messages and local listings echo it)."""
    scheme: Literal["file", "s3", "gs"]
    """``file`` for a plain path too."""
    bucket: str
    """The bucket; empty for a local file."""
    key: str
    """The object key, or the local path (may be empty or end with / only for a listing prefix)."""


def malformed(url: str, why: str) -> StorageError:
    return StorageError(url, f"{why}; allowed: {FORMS}", kind="malformed")


def parse(url: str, *, prefix: bool = False) -> Location:
    """Split and check ``url``; ``prefix`` allows an empty key or a trailing / (a "directory" to list)."""
    if not isinstance(url, str) or not url:
        raise malformed(repr(url), "empty or not a string")
    if "\x00" in url:
        raise malformed(repr(url), "contains a NUL character")
    match = _SCHEME.match(url)
    if match is None:
        return Location(url=url, scheme="file", bucket="", key=_checked_path(url, url))
    scheme, rest = match.group(1), url[match.end() :]
    if scheme == "file":
        if not rest:
            raise malformed(url, "file:// without a PATH")
        return Location(url=url, scheme="file", bucket="", key=_checked_path(url, rest))
    if scheme not in ("s3", "gs"):
        raise malformed(url, f"unknown scheme {scheme + '://'!r}")
    bucket, _, key = rest.partition("/")
    _check_bucket(url, scheme, bucket)
    _check_key(url, key, prefix=prefix)
    return Location(url=url, scheme="s3" if scheme == "s3" else "gs", bucket=bucket, key=key)


def _checked_path(url: str, path: str) -> str:
    if ".." in path.split("/"):
        raise malformed(url, "a '..' segment (resolve the path first)")
    return path


def _check_key(url: str, key: str, *, prefix: bool) -> None:
    if not key and not prefix:
        raise malformed(url, "no KEY after the bucket")
    if not prefix and key.endswith("/"):
        raise malformed(url, "KEY ends with '/' (that names a directory, not an object)")
    segments = key.split("/")
    if "." in segments or ".." in segments:
        raise malformed(url, "a '.' or '..' segment in KEY")
    if len(key.encode()) > _MAX_KEY_BYTES:
        raise malformed(url, f"KEY longer than {_MAX_KEY_BYTES} bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        raise malformed(url, "a control character in KEY")


def _check_bucket(url: str, scheme: str, bucket: str) -> None:
    """The providers' published naming rules, so a typo fails here rather than as a vague 400 or 404."""
    if scheme == "s3":
        bad = (
            not _S3_BUCKET.match(bucket)
            or ".." in bucket
            or bool(_IPV4.match(bucket))
            or bucket.startswith(_S3_RESERVED[0])
            or bucket.endswith(_S3_RESERVED[1])
        )
        rule = _S3_RULE
    else:
        parts = bucket.split(".")
        bad = (
            not _GCS_BUCKET.match(bucket)
            or (len(bucket) > 63 and "." not in bucket)
            or any(not p or len(p) > 63 for p in parts)
            or bool(_IPV4.match(bucket))
            or bucket.startswith("goog")
            or re.search(r"g[o0]{2}g[l1]e", bucket) is not None
        )
        rule = _GCS_RULE
    if bad:
        name = "S3" if scheme == "s3" else "GCS"
        raise malformed(url, f"bad {name} bucket name {bucket!r} (a bucket name is {rule})")


def join(base: str, *parts: str) -> str:
    """``base`` and relative ``parts`` with exactly one / between each (URLs and local paths alike)."""
    if not base:
        raise malformed(repr(base), "cannot join onto an empty base")
    out = base
    for part in parts:
        if part.startswith("/"):
            raise malformed(base, f"cannot join the absolute part {part!r} (parts are relative)")
        if part:
            out = out + part if out.endswith("/") else f"{out}/{part}"
    return out


def render(loc: Location, key: str) -> str:
    """The URL of ``key`` in ``loc``'s bucket (remote only)."""
    return f"{loc.scheme}://{loc.bucket}/{key}"


def directory(key: str) -> str:
    """A listing prefix as a directory: ``a/b`` lists ``a/b/...``, never ``a/bc``."""
    return key if not key or key.endswith("/") else key + "/"
