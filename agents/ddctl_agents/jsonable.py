"""Typed config dataclasses to and from plain JSON, validating on the way back.

Job files, tapes and the syncer's ``/v1/job`` answer all carry configs this
way, so a value that was valid when written is re-validated when read.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

from ddctl_agents.errors import ConfigError


def to_json(value: Any) -> Any:
    """Dataclasses, tuples and paths as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def from_json(cls: type, data: Any) -> Any:
    """Rebuild ``cls`` from ``to_json`` output, validating through the dataclasses."""
    if not isinstance(data, dict):
        raise ConfigError(f"{cls.__name__} must be a JSON object")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} keys: {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(names))}")
    try:
        return cls(**{k: _coerce(hints[k], v) for k, v in data.items()})
    except TypeError as exc:
        raise ConfigError(f"{cls.__name__}: {exc}") from None


def _coerce(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_json(hint, value)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return None if value is None else _coerce(options[0], value)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            if not isinstance(value, list):
                raise ConfigError(f"expected a list, got {value!r}")
            return tuple(_coerce(args[0], v) for v in value)
        if not isinstance(value, list) or len(value) != len(args):
            raise ConfigError(f"expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(a, v) for a, v in zip(args, value, strict=True))
    if hint is Path:
        return Path(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
