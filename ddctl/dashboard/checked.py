"""The synchronizer's ``/v1/status`` as the dashboard may draw it: checked once, where it is received.

The answer comes from another process (a synchronizer, maybe a compromised one), so before anything draws it
every string has its control characters escaped and is bounded (no escape sequence reaches the operator's
terminal, no newline forges an event line), a figure that is not finite or out of range is no figure, and lists
and nesting are bounded. Then it is drawn once, off screen: a status of another shape (a string where a list
is, a row without its id) fails here, as one error the view shows, not as a traceback that ends ``--watch``.
"""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from ddctl.control.shard_status import MALFORMED
from ddctl.control.state import InstanceRecord
from ddctl_agents.core.text import printable

MOST_ITEMS = 10_000
"""Items of one list (learners, events, a series) kept; the synchronizer keeps far fewer."""
MOST_DEPTH = 12
MOST_FIGURE = 1e18
"""A larger figure (bytes, tokens, seconds) is no figure: it would overflow a float or a timestamp."""
MOST_TEXT = 500
SHAPE_ERRORS = (*MALFORMED, ZeroDivisionError, RecursionError)
SERIES = ("val_bpb",)
"""Lists of [t, ..., value] points: a point with a figure that is not one is dropped."""


TIMED = ("events", "recent_rounds")
"""Lists of rows each at a time ``t``: sorted with ddctl's own events, so each ``t`` must be a time."""
LATEST = 1e11
"""Seconds since 1970 no clock reaches (the year 5138); a later ``t`` is no time."""


OTHER_SHAPE = "the synchronizer answered a status of another shape"


class OtherShape(ValueError):
    """The synchronizer answered a status the dashboard cannot draw; the message says why."""


def checked_status(raw: Any) -> dict[str, Any]:
    """``raw`` made safe to draw (strings escaped, figures finite), or ``OtherShape`` saying why it cannot be drawn."""
    try:
        if not isinstance(raw, dict):
            raise TypeError(f"a {type(raw).__name__}, not an object")
        status = clean_status(raw)
        for key in SERIES:
            if isinstance(status.get(key), list):
                status[key] = [p for p in status[key] if not isinstance(p, list) or None not in p]
        for key in TIMED:
            _timed(key, status.get(key) or [])
        _draw(status)
    except SHAPE_ERRORS as exc:
        reason = printable(f"{type(exc).__name__}: {exc}", 300)
        raise OtherShape(f"{OTHER_SHAPE}: {reason}") from None
    return status


def clean_status(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with its strings escaped and its figures finite (a sharded synchronizer's shards' answers, before
    they are added up); raises one of ``MALFORMED`` where it nests too deep or holds what JSON does not."""
    cleaned: dict[str, Any] = _clean(raw, 0)
    return cleaned


def _clean(value: Any, depth: int) -> Any:
    if depth > MOST_DEPTH:
        raise ValueError(f"nested deeper than {MOST_DEPTH}")
    if isinstance(value, str):
        return printable(value, MOST_TEXT)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return value if abs(value) <= MOST_FIGURE else None  # False for NaN; no float() of a huge int
    if isinstance(value, dict):
        return {_key(k): _clean(v, depth + 1) for k, v in list(value.items())[:MOST_ITEMS]}
    if isinstance(value, list):
        return [_clean(v, depth + 1) for v in value[:MOST_ITEMS]]
    raise TypeError(f"a {type(value).__name__} in a JSON answer")


def _key(key: Any) -> Any:
    """A JSON key is a string; the shards' rows, summed here, key their versions by fragment number."""
    return printable(key, 100) if isinstance(key, str) else _clean(key, 0)


def _timed(key: str, rows: Any) -> None:
    for row in rows:
        when = row.get("t", 0.0)
        if isinstance(when, bool) or not isinstance(when, int | float) or not 0 <= when <= LATEST:
            raise ValueError(f"{key}: a t of {when!r} is no time")


def _draw(status: dict[str, Any]) -> None:
    """Build and draw the snapshot of ``status`` alone, every learner it names drawn as one of the run's: what
    cannot be drawn raises here (the drawing is pure: the same status draws the same way on the operator's screen)."""
    from ddctl.dashboard.render import render
    from ddctl.dashboard.snapshot import RunRecords, SyncerView, build

    named = [e.get("id") for e in status.get("learners") or [] if isinstance(e, dict)]
    learners = [InstanceRecord("", str(n), "", "", "learner", "training", "", 0.0, {}) for n in named]
    snap = build(RunRecords(run="", provider="", instances=learners), SyncerView(status, 0.0), 0.0)
    Console(file=io.StringIO(), width=200, force_terminal=True).print(render(snap, 200, 10_000))
