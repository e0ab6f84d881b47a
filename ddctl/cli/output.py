"""How every command talks to the terminal: JSON for scripts, tables for people.

Colour, progress bars and live redraw appear only when the stream is a
terminal, so piped output and CI logs stay plain.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def stdout() -> Console:
    """A terminal gets its own width and colour; a pipe gets plain text wide enough not to truncate."""
    tty = sys.stdout.isatty()
    return Console(file=sys.stdout, no_color=not tty, highlight=False, width=None if tty else 160)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


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
