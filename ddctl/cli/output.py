"""How every command talks to the terminal: JSON for scripts, tables for people.

Colour, progress bars and live redraw appear only when the stream is a
terminal, so piped output and CI logs stay plain.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text


def stdout() -> Console:
    """A terminal gets its own width and colour; a pipe gets plain text wide enough not to truncate."""
    tty = sys.stdout.isatty()
    return Console(file=sys.stdout, no_color=not tty, highlight=False, width=None if tty else 160)


def print_json(data: Any) -> None:
    """Strict JSON: a figure that is not a number (NaN, an infinity) is null, which every parser reads."""
    sys.stdout.write(json.dumps(_finite(data), indent=2, sort_keys=True, default=str, allow_nan=False) + "\n")


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, Mapping):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(value) for value in data]
    return data


def print_table(title: str, rows: Mapping[str, Any]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in rows.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    stdout().print(table)


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[Any]:
    """Yields update(done, total); draws a bar on stderr only if stderr is a terminal."""
    if not sys.stderr.isatty():
        yield lambda done, total: None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda done, total: bar.update(task, completed=min(done, total), total=total)


class _Stage:
    """The spinner's text: the latest stage and the seconds since the start, recomputed at every redraw."""

    def __init__(self, text: str) -> None:
        self.text, self.started = text, time.monotonic()

    def __rich__(self) -> Text:
        return Text(f"{self.text} ({time.monotonic() - self.started:.0f}s)")


@contextmanager
def progress_lines(title: str) -> Iterator[Callable[[str], None]]:
    """Yields say(text) for the stages of a long command (``up``), so a wait of half a minute is never silent.

    On a terminal, stderr shows a spinner with the latest stage and the seconds so far, and each stage
    stays as a line above it; elsewhere each stage is one plain line on stderr, no colour, no redraw.
    say may be called from worker threads (rich's console takes a lock)."""
    if not sys.stderr.isatty():

        def plain(text: str) -> None:
            sys.stderr.write(f"{text}\n")
            sys.stderr.flush()

        yield plain
        return
    console, stage = Console(file=sys.stderr, highlight=False), _Stage(title)
    with console.status(stage):

        def say(text: str) -> None:
            stage.text = text
            console.print(Text.assemble((f"{time.monotonic() - stage.started:5.1f}s ", "dim"), text))

        yield say
