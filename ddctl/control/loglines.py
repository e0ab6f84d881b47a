"""Log lines by time, for ``ddctl logs --since``: reading ``90s``, ``5m``, ``1h`` or an ISO time, and each line's stamp.

The agents stamp every line with an ISO 8601 UTC time (``ddctl_agents.entrypoint.configure_logging``); logs
written before that used Python's default ``2026-11-30 12:34:56,789`` in local time, which is read as such.
A line without a stamp (a traceback's continuation, the exit summary an agent prints on stdout) belongs to
the last stamped line before it, so a kept record keeps its whole traceback. Pure: ``now`` is an argument.
"""

from __future__ import annotations

import re
from datetime import datetime

from ddctl.errors import DdctlError

STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,6}))?(Z|[+-]\d{2}:?\d{2})?(?=\s|$)")
DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str, now: float) -> float:
    """The epoch time ``--since`` means: ``now`` less a duration (``90s``, ``5m``, ``1h30m``, ``2d``; a bare
    number is seconds), or an ISO time (``2026-11-30T12:00:00Z``; without a zone, this machine's local time)."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return now - float(value)
    if value and DURATION.sub("", value) == "":
        return now - sum(float(n) * UNIT_S[unit] for n, unit in DURATION.findall(value))
    try:
        return datetime.fromisoformat(text.strip()).timestamp()  # a naive time is local, as a user types it
    except ValueError:
        raise DdctlError(
            f"--since: expected a duration such as 90s, 5m or 1h, or an ISO time such as 2026-11-30T12:00:00Z; got {text!r}"
        ) from None


def line_time(line: str) -> float | None:
    """The epoch time a log line is stamped with, or None when it carries no stamp."""
    found = STAMP.match(line)
    if found is None:
        return None
    day, clock, fraction, zone = found.groups()
    iso = f"{day}T{clock}{'.' + fraction.ljust(6, '0') if fraction else ''}{'+00:00' if zone == 'Z' else zone or ''}"
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:  # 2026-13-45: digits in the right places but not a time
        return None


class SinceFilter:
    """Keeps the lines of one stream stamped at or after ``since`` (all of them when ``since`` is None).

    Stateful across calls, so a stream can be fed line by line as it grows (``--follow``): an unstamped line
    is kept when the last stamped line before it was; one with no stamped line before it is not, as its time
    is unknown."""

    def __init__(self, since: float | None) -> None:
        self.since = since
        self._keeping = since is None

    def __call__(self, line: str) -> bool:
        if self.since is None:
            return True
        stamp = line_time(line)
        if stamp is not None:
            self._keeping = stamp >= self.since
        return self._keeping
