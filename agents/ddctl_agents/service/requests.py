"""Every field a client can send, with its type and bound, checked in one place.

JSON bodies are pydantic models (strict types, no unknown keys, finite numbers,
every integer and float bounded); headers, path segments and query strings go
through ``parse_count`` and ``parse_query``, which accept integers written in
ASCII digits only (``str.isdigit`` also accepts '²', which ``int`` refuses).
Whatever fails here is a ``BadRequest`` (HTTP 400) naming the field, never a
500, and nothing non-finite or unbounded gets past it into the syncer's state,
its log or its status page.
"""

from __future__ import annotations

import re
from typing import Annotated, TypeVar
from urllib.parse import parse_qs

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ddctl_agents.core.pacing import MOST_IN_FLIGHT
from ddctl_agents.core.schedule import CADENCES
from ddctl_agents.errors import BadRequest

MAX_COUNT = (1 << 62) - 1
"""Steps, tokens, bytes: far above any real run, far below where float conversions overflow."""

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Seconds = Annotated[float, Field(ge=0.0, le=86_400.0, allow_inf_nan=False)]
Lifetime = Annotated[float, Field(ge=0.0, le=1e9, allow_inf_nan=False)]
"""Seconds summed over a learner's life (a run may last weeks; 1e9 s is 31 years)."""
Rate = Annotated[float, Field(ge=0.0, le=1e12, allow_inf_nan=False)]
Loss = Annotated[float, Field(ge=0.0, le=1e6, allow_inf_nan=False)]
Identity = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
Region = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{0,64}$")]


def _a_cadence(k: int) -> int:
    if k not in CADENCES:
        raise ValueError(f"must be one of {', '.join(map(str, CADENCES))}, got {k}")
    return k


Cadence = Annotated[int, Field(strict=True), AfterValidator(_a_cadence)]
"""A learner sends each fragment every k*H steps (``core/schedule.CADENCES``); an integer, not 2.0."""
Sentence = Annotated[str, Field(pattern=r"^[\x20-\x7e]{0,200}$")]
"""Printable ASCII only: it is written into logs and events, where a newline could forge a line."""
Accelerator = Annotated[str, Field(pattern=r"^[A-Za-z0-9 ._()/+-]{0,64}$")]
"""A device name as torch gives it ("NVIDIA H100 80GB HBM3") or "cpu": it becomes a metrics label and a table cell."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RegisterBody(_Body):
    learner: Identity
    incarnation: Count
    region: Region = ""
    cadence: Cadence = 1


class LeaveBody(_Body):
    learner: Identity
    reason: Sentence = "left"
    tokens: Count | None = None
    """Tokens this life of the learner trained in all (its last word; heartbeats may have missed the last steps)."""


class ReadmitBody(_Body):
    learner: Identity


class CutBody(_Body):
    """A global checkpoint's marker: the checkpoint epoch the coordinator picked."""

    epoch: Annotated[int, Field(ge=1, le=MAX_COUNT)]


class HandoffBody(_Body):
    """Give a fragment to another shard at a new shard map epoch."""

    fragment: Count
    to: Annotated[str, Field(pattern=r"^S[0-9]{1,3}$")]
    epoch: Annotated[int, Field(ge=1, le=MAX_COUNT)]


class StopBody(_Body):
    reason: Sentence = "stopped by the operator"


class HeartbeatBody(_Body):
    """A learner's progress report: every number is bounded, so no estimate built on it can overflow."""

    learner: Identity
    step: Count
    step_time: Seconds
    tokens: Count
    tokens_per_s: Rate
    loss: Loss | None = None
    staleness: Count = 0
    due: Annotated[list[Count], Field(max_length=4096)] = Field(default_factory=list)
    """Each fragment's next due step: empty, or exactly one per fragment."""
    rtt_s: Annotated[float, Field(ge=0.0, le=600.0, allow_inf_nan=False)] | None = None
    up_bytes: Count = 0
    up_seconds: Seconds = 0.0
    """The uplink as the learner's kernel timed it: bytes acknowledged over busy time (``core.links``)."""
    accelerator: Accelerator = ""
    """What one rank trains on; "" from a learner too old to say, which leaves its MFU unknown."""
    devices: Annotated[int, Field(ge=1, le=4096)] = 1
    """Ranks this one learner trains on; ``tokens_per_s`` is all of them together."""
    memory_gb: Annotated[float, Field(ge=0.0, le=65_536.0, allow_inf_nan=False)] = 0.0
    """Memory of one device in GB as reported (0: unknown)."""
    uploads_in_flight: Annotated[int, Field(ge=0, le=MOST_IN_FLIGHT)] = 0
    """Uploads it keeps in flight now (its pacer's cap, ``core/pacing``); 0 from a learner too old to say."""
    train_s: Lifetime | None = None
    """Seconds this life of the learner has spent in its training loop (None: not said); the job's goodput."""
    region: Region = ""
    """The region it registered with, again: a syncer restarted from its log knows the learner is live but not where
    it is, and the learner does not register again (``roster.heard`` fills it in; registration's answer wins)."""


Body = TypeVar("Body", bound=_Body)


def parse_body(model: type[Body], raw: bytes) -> Body:
    """``raw`` JSON as ``model``, or BadRequest naming the first field that is wrong."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        detail = error["msg"]
        if error["type"] == "json_invalid":
            raise BadRequest(f"body is not JSON: {detail.removeprefix('Invalid JSON: ')}") from None
        raise BadRequest(f"field {where!r}: {detail}" if where else f"body: {detail}") from None


_COUNT = re.compile(r"-?[0-9]{1,19}")


def parse_count(text: str | None, what: str, *, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
    """An integer written in ASCII digits within [minimum, maximum], or BadRequest naming ``what``."""
    if text is None or not _COUNT.fullmatch(text) or not minimum <= int(text) <= maximum:
        raise BadRequest(f"{what} must be an integer in [{minimum}, {maximum}] written in ASCII digits, got {text!r:.40}")
    return int(text)


def parse_versions(raw: str, count: int) -> list[int]:
    """A subscriber's ``since``: the version it holds of each of the ``count`` fragments (-1: none; empty: none of any)."""
    parts = raw.split(",", count) if raw else []
    if len(parts) > count:
        raise BadRequest(f"since must list {count} versions, got more")
    since = [parse_count(x, "query parameter 'since'", minimum=-1) for x in parts] if raw else [-1] * count
    if len(since) != count:
        raise BadRequest(f"since must list {count} versions, got {len(since)}")
    return since


def parse_query(raw: bytes) -> dict[str, str]:
    """A query string's parameters (the last value of each); it must be ASCII and percent-decode to UTF-8."""
    try:
        text = raw.decode("ascii")
        pairs = parse_qs(text, keep_blank_values=True, strict_parsing=False, errors="strict", max_num_fields=16)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"query string is not valid: {exc}") from None
    return {key: values[-1] for key, values in pairs.items()}
