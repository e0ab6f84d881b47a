"""A reason made of what a peer sent (its tensor names, an exception's message about its data), fit to be stored,
answered and logged: bounded, so the log record that carries it (at most 1,000 characters) always takes it."""

from __future__ import annotations

MOST_REASON = 500


def clip(text: str, most: int = MOST_REASON) -> str:
    """``text`` cut to ``most`` characters, its end marked when it was cut."""
    return text if len(text) <= most else f"{text[: most - 14]}... (cut {len(text) - most + 14})"
