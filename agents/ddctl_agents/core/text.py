"""Text that came from elsewhere (what a peer sent, an exception's message about its data, a cloud API's error),
fit to be stored, answered and logged: bounded, so the log record that carries it always takes it, and, where it
goes into a log line, with its control characters escaped, so it cannot forge a line or colour a terminal."""

from __future__ import annotations

MOST_REASON = 500


def clip(text: str, most: int = MOST_REASON) -> str:
    """``text`` cut to ``most`` characters, its end marked when it was cut."""
    return text if len(text) <= most else f"{text[: most - 14]}... (cut {len(text) - most + 14})"


def printable(text: str, most: int = MOST_REASON) -> str:
    """``clip(text)`` with every control character escaped (a newline as ``\\n``, ESC as ``\\x1b``)."""
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return clip(shown, most)
