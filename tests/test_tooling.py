"""Lint and strict typing are part of the suite, so CI keeps them clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean() -> None:
    out = run("ruff", "check", "ddctl", "agents", "tests")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_is_clean() -> None:
    out = run("mypy")
    assert out.returncode == 0, out.stdout + out.stderr
