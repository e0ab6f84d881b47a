"""The learner's exit summary on disk: what ``ddctl`` and the benchmarks read once a learner has ended.

The file is replaced whole (a reader never sees half of one), and every incarnation
also adds its summary as one line of ``NAME.history.jsonl`` beside it, so a learner
that was preempted and restarted keeps the record of each life.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write(path: Path, summary: dict[str, Any]) -> None:
    """``summary`` to ``path`` (tmp file, then rename) and appended to its history."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, path)
    with path.with_suffix(".history.jsonl").open("a") as history:
        history.write(json.dumps(summary) + "\n")
