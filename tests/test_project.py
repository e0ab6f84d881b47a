"""The README's promises about set-up hold."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "the README starts with a bash block of set-up commands"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_starts_with_exactly_two_setup_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert text.index("```bash") < 20
    commands = setup_commands()
    assert len(commands) == 2
    assert commands[0].endswith("ddctl up --dry-run") and "pytest" in commands[1]


def test_ci_runs_the_readmes_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert setup_commands()[1] in ci


def test_torch_is_pinned_to_the_local_wheel() -> None:
    assert '"torch==2.13.0"' in (ROOT / "pyproject.toml").read_text()
