"""Draw docs/dashboard.svg from a recorded snapshot: `python docs/dashboard_svg.py [RECORDING] [OUT]`."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from rich.console import Console

from ddctl.dashboard.render import render
from ddctl.dashboard.snapshot import from_recording

ROOT = Path(__file__).resolve().parents[1]


def main(recording: Path, out: Path, width: int = 100, height: int = 30) -> None:
    snapshot = from_recording(json.loads(recording.read_text()))
    console = Console(record=True, width=width, height=height, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(render(snapshot, width, height))
    console.save_svg(str(out), title=f"ddctl status --watch  ({snapshot['run']})")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        Path(args[0]) if args else ROOT / "tests/data/dashboard/preempted.json",
        Path(args[1]) if len(args) > 1 else ROOT / "docs/dashboard.svg",
    )
