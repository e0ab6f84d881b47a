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


class _UniqueKeys(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type hints here
    """YAML's safe loader, refusing a key written twice in one mapping (it keeps the last, silently: a second
    ``training:`` section would replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: its keys may be overridden, once
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool):
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is written twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def read_yaml(path: Path, error: Callable[..., Exception], what: str) -> Any:
    """``path`` parsed; ``error(message, path=path)`` naming the file and the problem otherwise."""
    try:
        raw = yaml.load(path.read_bytes().decode("utf-8"), Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader
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
