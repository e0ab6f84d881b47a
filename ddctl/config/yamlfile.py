"""A user's YAML file read as plain data, or an error that says what is wrong with it.

Why a module: a file the user hands us may be anything. It must be UTF-8 text
and valid YAML, and it must stay small once its aliases are expanded: PyYAML
shares an aliased node instead of copying it, so nine levels of nine aliases
load at once, but every later walk (validation dumps it to JSON) meets
9^9 values and never ends.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

MAX_VALUES = 100_000
"""Values in a file with its aliases expanded: a regions file has a few hundred; an alias bomb, billions."""


def read_yaml(path: Path, error: Callable[..., Exception], what: str) -> Any:
    """``path`` parsed; ``error(message, path=path)`` naming the file and the problem otherwise."""
    try:
        raw = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})", path=path) from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); {what} is YAML in UTF-8", path=path) from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML ({exc})", path=path) from None
    if expands_past(raw, MAX_VALUES):
        raise error(f"{path}: expands to more than {MAX_VALUES:,} values (YAML aliases nested in aliases?); {what} "
                    "holds a few hundred", path=path)  # fmt: skip
    return raw


def expands_past(raw: Any, limit: int) -> bool:
    """Whether ``raw`` holds more than ``limit`` values once every alias is expanded, counted without expanding
    them: the walk stops at the limit."""
    stack, seen = [raw], 0
    while stack:
        seen += 1
        if seen > limit:
            return True
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False
