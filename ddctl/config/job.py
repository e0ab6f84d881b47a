"""The one way flat knobs become a JobConfig: regions.yaml's ``training:``, ``ddctl train``,
``ddctl syncer init`` and the benchmarks all go through ``build_job``.

Each knob names the field(s) of the typed configs it sets (``KNOBS``); a knob left
out keeps that config's default, so every default is written once, in the
config class that owns it (``ddctl_agents.train.config``, ``.learner``,
``core.quorum``, ...). ``Knobs`` is the pydantic model of the knobs, derived
from the same table: a knob's type is the type of the field it sets.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ConfigDict, create_model

from ddctl_agents.errors import ConfigError
from ddctl_agents.train.job import JobConfig

J = TypeVar("J", bound=JobConfig)

KNOBS: dict[str, tuple[str, ...]] = {
    "preset": ("inner.preset",),
    "batch_size": ("inner.batch_size",),
    "lr": ("inner.lr",),
    "seed": ("inner.seed",),
    "data": ("data.paths",),
    "token_data": ("data.token_paths",),
    "vocab_size": ("inner.vocab_size",),
    "model": ("inner.model",),
    "max_bytes": ("data.max_bytes",),
    "eval_windows": ("data.eval_windows",),
    "tokens": ("budget.tokens",),
    "learners": ("budget.learners",),
    "fragments": ("sync.fragments",),
    "inner_steps": ("sync.inner_steps", "syncer.inner_steps"),
    "codec": ("sync.codec",),
    "error_feedback": ("sync.error_feedback",),
    "push_before_overwrite": ("sync.push_before_overwrite",),
    "quorum": ("syncer.quorum.quorum",),
    "grace": ("syncer.quorum.grace",),
    "overlap": ("syncer.quorum.overlap",),
    "outer_lr": ("syncer.outer.lr",),
    "outer_momentum": ("syncer.outer.momentum",),
    "outer_warmup": ("syncer.outer.warmup",),
    "merge": ("syncer.merge",),
    "max_behind": ("syncer.max_behind",),
    "late_weight": ("syncer.late_weight",),
    "max_rejections": ("syncer.trust.max_rejections",),
    "fragmentation": ("fragmentation",),
    "down_codec": ("down_codec",),
    "threads": ("threads",),
}
"""Knob -> the dotted path(s) in a JobConfig it sets (H is both the learners' and the syncer's)."""


@overload
def build_job(knobs: Mapping[str, Any]) -> JobConfig: ...
@overload
def build_job(knobs: Mapping[str, Any], base: J) -> J: ...
def build_job(knobs: Mapping[str, Any], base: JobConfig | None = None) -> JobConfig:
    """``base`` (default: a default JobConfig) with every knob that is not None applied; each config validates
    its own ranges, and a ConfigError names the knob when one alone is at fault."""
    start: Any = base if base is not None else JobConfig()
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ConfigError(f"unknown knobs {', '.join(unknown)}; known: {', '.join(KNOBS)}")
    chosen = {k: v for k, v in knobs.items() if v is not None}
    try:
        return typing.cast(JobConfig, _apply(start, chosen))
    except ConfigError as exc:
        fine = {}  # the knobs a config takes alone: the context a knob that depends on others is judged in
        for knob, value in chosen.items():
            try:
                _apply(start, {knob: value})
                fine[knob] = value
            except ConfigError:
                pass
        for knob, value in chosen.items():
            if knob in fine:
                continue
            try:
                _apply(start, {**fine, knob: value})
            except ConfigError as alone:
                raise KnobError(knob, str(alone)) from None
        raise ConfigError(str(exc)) from None


class KnobError(ConfigError):
    """A knob whose value its config refuses; ``knob`` names it (for ``training.<knob>`` messages)."""

    def __init__(self, knob: str, message: str) -> None:
        super().__init__(f"{knob}: {message}")
        self.knob, self.problem = knob, message


def default(knob: str) -> Any:
    """The value a knob has when it is not given (for --help)."""
    value: Any = JobConfig()
    for part in KNOBS[knob][0].split("."):
        value = getattr(value, part)
    return value


@cache
def knobs_model() -> type[BaseModel]:
    """The knobs as a pydantic model (all optional, no unknown keys), typed from the fields they set."""
    fields: dict[str, Any] = {}
    for knob, paths in KNOBS.items():
        fields[knob] = (_field_type(paths[0]) | None, None)
    config = ConfigDict(extra="forbid", strict=True, frozen=True)
    return create_model("Knobs", __config__=config, **fields)


def _field_type(path: str) -> Any:
    cls: Any = JobConfig
    *parents, leaf = path.split(".")
    for part in parents:
        cls = typing.get_type_hints(cls)[part]
    hint = typing.get_type_hints(cls)[leaf]
    if typing.get_origin(hint) is tuple:  # a list where the config keeps a tuple (paths as strings: from YAML)
        item = typing.get_args(hint)[0]
        return list[str] if item is Path else list[item]  # type: ignore[valid-type]
    return hint


def _apply(config: Any, knobs: Mapping[str, Any]) -> Any:
    """Set dotted paths, building each nested config once with all its changes (so cross-field checks see them all)."""
    tree: dict[str, Any] = {}
    for knob, value in knobs.items():
        for path in KNOBS[knob]:
            node = tree
            *parents, leaf = path.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = tuple(value) if isinstance(value, list) else value
    return _replace(config, tree)


def _replace(config: Any, changes: dict[str, Any]) -> Any:
    values = {k: _replace(getattr(config, k), v) if isinstance(v, dict) else v for k, v in changes.items()}
    return dataclasses.replace(config, **values)
