"""When each fragment is due: every H inner steps, fragments staggered evenly.

A learner's first send of fragment p follows the grid ``(t + offset_p) % H == 0``
with ``offset_p = p * H // P``: with P = H one fragment leaves every step, and
every first send carries at least H/P steps of drift. [ours] After that the
schedule is relative to adoption: fragment p is due H - 1 steps after the learner
adopted a new version of it (or H steps after its last send if no version came
back). In the normal flow (send after step t, answer adopted after step t + 1)
this is the same grid; but a broadcast re-aligns every learner that adopts it,
so step-time jitter cannot make learners drift apart for good. On a fixed grid
it did: after ~1000 steps with 5% jitter, learners' sends of a fragment no
longer fell inside one grace window, and 43% of trained tokens were overwritten.

A learner on a slow link may send every k-th period (its *cadence*, k in
``CADENCES``): its schedule is this one with a period of k*H steps, so it
moves 1/k of the bytes (docs/design.md, "Cadence").
"""

from __future__ import annotations

from ddctl_agents.errors import ConfigError

CADENCES = (1, 2, 4, 8)
"""A learner sends each fragment every k*H inner steps, k one of these."""


def check_cadence(cadence: object) -> int:
    if type(cadence) is not int or cadence not in CADENCES:
        raise ConfigError(f"cadence must be one of {', '.join(map(str, CADENCES))} (send every k*H steps), got {cadence!r}")
    return cadence


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


def due_after_adoption(step: int, inner_steps: int) -> int:
    """A version adopted after step ``step`` makes its fragment due H - 1 steps later."""
    return step + max(inner_steps - 1, 1)


def next_due_step(after: int, fragment: int, fragments: int, inner_steps: int) -> int:
    """The first step > ``after`` at which ``fragment`` is due."""
    off = offset(fragment, fragments, inner_steps)
    step = after + 1
    return step + (-(step + off)) % inner_steps
