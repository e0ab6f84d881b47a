"""When each fragment is due: every H inner steps, fragments staggered evenly.

Fragment p is sent after inner step t when ``(t + offset_p) % H == 0`` with
``offset_p = p * H // P``: with P = H one fragment leaves every step, and the
first send of every fragment carries at least H/P steps of drift.
"""

from __future__ import annotations

from ddctl_agents.errors import ConfigError


def check_schedule(fragments: int, inner_steps: int) -> None:
    if fragments < 1:
        raise ConfigError(f"fragments must be >= 1, got {fragments}")
    if inner_steps < 1:
        raise ConfigError(f"inner steps H must be >= 1, got {inner_steps}")


def offset(fragment: int, fragments: int, inner_steps: int) -> int:
    return fragment * inner_steps // fragments


def is_due(step: int, fragment: int, fragments: int, inner_steps: int) -> bool:
    """True when fragment ``fragment`` leaves right after inner step ``step`` (1-based)."""
    return step > 0 and (step + offset(fragment, fragments, inner_steps)) % inner_steps == 0


def due_fragments(step: int, fragments: int, inner_steps: int) -> list[int]:
    return [p for p in range(fragments) if is_due(step, p, fragments, inner_steps)]


def next_due_step(after: int, fragment: int, fragments: int, inner_steps: int) -> int:
    """The first step > ``after`` at which ``fragment`` is due."""
    off = offset(fragment, fragments, inner_steps)
    step = after + 1
    return step + (-(step + off)) % inner_steps
