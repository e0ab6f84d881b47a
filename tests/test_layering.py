"""The agents side runs in the regions and must not depend on the laptop side."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_agents_never_import_the_laptop_side_or_a_bare_agents_package() -> None:
    files = list((ROOT / "agents" / "ddctl_agents").rglob("*.py"))
    assert files
    for path in files:
        bad = {n for n in imports(path) if n == "ddctl" or n.startswith("ddctl.") or n == "agents" or n.startswith("agents.")}
        assert not bad, f"{path} imports {bad}"


def test_the_core_does_no_io() -> None:
    forbidden = {"socket", "subprocess", "asyncio", "httpx", "time", "random", "os"}
    for path in (ROOT / "agents" / "ddctl_agents" / "core").glob("*.py"):
        if path.name in {"tape.py", "_native.py"}:  # the tape writer and the native loader are the shell's edge
            continue
        assert not imports(path) & forbidden, f"{path} imports {imports(path) & forbidden}"


def test_modules_stay_small() -> None:
    for path in list((ROOT / "ddctl").rglob("*.py")) + list((ROOT / "agents").rglob("*.py")):
        assert len(path.read_text().splitlines()) <= 500, f"{path} is over 500 lines"
