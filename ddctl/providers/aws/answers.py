"""What an AWS API answers, read only in the shape the provider expects.

boto3 hands back whatever JSON the endpoint sent: a proxy, a throttled or
changed API, or moto may answer a page without its list, a list of strings, or
an item without the field a later call needs. A KeyError or AttributeError from
such an answer ended ``up --plan``, ``down --orphans`` and the controller's loop
with a traceback. Here an answer without its list is a ``DdctlError`` naming the
call, an item of another shape is logged (its repr, cut) and skipped, and a
field another call is made with must be a non-empty string.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from ddctl.errors import DdctlError

_log = logging.getLogger(__name__)


def records(answer: object, key: str, call: str) -> list[dict[str, Any]]:
    """The objects of ``answer[key]``; a page without the key has none (botocore leaves empty lists out)."""
    listed = answer.get(key, []) if isinstance(answer, dict) else None
    if not isinstance(listed, list):
        raise DdctlError(f"AWS answered {call} without a list of {key}: {str(answer)[:200]!r}")
    kept = [item for item in listed if isinstance(item, dict)]
    if len(kept) < len(listed):
        _log.warning("AWS answered %s with %d %s of another shape: skipped (%.200r)", call, len(listed) - len(kept), key, listed)
    return kept


def paged(pages: Iterable[object], key: str, call: str) -> Iterator[dict[str, Any]]:
    """The objects of ``key`` over every page of a paginated call."""
    for page in pages:
        yield from records(page, key, call)


def named(record: dict[str, Any], key: str, call: str) -> str:
    """``record[key]`` when it is a non-empty string: the id the next call is made with (never ``str(None)``)."""
    value = record.get(key)
    if not isinstance(value, str) or not value or not value.isprintable() or len(value) > 256:
        raise DdctlError(f"AWS answered {call} with a {key} that is none: {str(value)[:60]!r}")
    return value
