"""Typed config dataclasses to and from plain JSON, through pydantic, validating on the way back.

Job files, tapes and the syncer's ``/v1/job`` answer all carry configs this
way, so a value that was valid when written is re-validated when read: pydantic
checks types and unknown keys, and each dataclass's ``__post_init__`` its
ranges (its ConfigError passes through unchanged).
"""

from __future__ import annotations

import dataclasses
import typing
from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ddctl_agents.errors import ConfigError


def to_json(value: Any) -> Any:
    """A config dataclass as plain JSON values (tuples as lists, paths as strings)."""
    kind: Any = type(value)
    return _adapter(kind).dump_python(value, mode="json")


def from_json(cls: type, data: Any) -> Any:
    """Rebuild ``cls`` from ``to_json`` output; a bad key or type is a ConfigError naming where."""
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        problem = "unknown key" if error["type"] in ("extra_forbidden", "unexpected_keyword_argument") else error["msg"]
        raise ConfigError(f"{cls.__name__}: {where or 'the value'}: {problem}") from None


@cache
def _adapter(cls: Any) -> TypeAdapter[Any]:
    _forbid_extra(cls)
    return TypeAdapter(cls)


def _forbid_extra(cls: Any) -> None:
    """Every dataclass reachable from ``cls`` refuses unknown keys (pydantic reads ``__pydantic_config__``)."""
    if dataclasses.is_dataclass(cls) and isinstance(cls, type):
        if "__pydantic_config__" not in vars(cls):
            cls.__pydantic_config__ = {"extra": "forbid"}  # type: ignore[attr-defined]
        for hint in typing.get_type_hints(cls).values():
            _forbid_extra(hint)
    for arg in typing.get_args(cls):
        _forbid_extra(arg)
