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


PROVIDER_KINDS = {"aws", "gcp", "docker", "process", "fake"}


def test_no_code_outside_providers_branches_on_a_provider_kind() -> None:
    """A new provider adds a folder and nothing else: no comparison with a kind, no import of one provider."""
    for path in (ROOT / "ddctl").rglob("*.py"):
        if "providers" in path.relative_to(ROOT / "ddctl").parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                constants = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                assert not constants & PROVIDER_KINDS, f"{path}:{node.lineno} branches on a provider kind"
            if isinstance(node, ast.ImportFrom) and node.module:
                kind = node.module.removeprefix("ddctl.providers.").split(".")[0]
                assert not (node.module.startswith("ddctl.providers.") and kind in PROVIDER_KINDS), (
                    f"{path}:{node.lineno} imports the {kind} provider; use ddctl.providers.get"
                )


def test_the_laptop_side_imports_no_cycle_between_modules() -> None:
    """ddctl's modules form no import cycle (module-level imports; lazy ones inside functions do not count)."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "ddctl").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        top = ast.parse(path.read_text()).body
        deps = set()
        for node in top:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddctl"):
                deps.add(node.module)
                deps |= {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = deps
    for start in graph:
        seen, stack = set(), [(start, (start,))]
        while stack:
            node, trail = stack.pop()
            for dep in graph.get(node, ()):
                if dep == start:
                    raise AssertionError(" -> ".join((*trail, dep)))
                if dep in graph and dep not in seen:
                    seen.add(dep)
                    stack.append((dep, (*trail, dep)))


def test_modules_stay_under_400_lines() -> None:
    for path in list((ROOT / "ddctl").rglob("*.py")) + list((ROOT / "agents").rglob("*.py")):
        assert len(path.read_text().splitlines()) <= 400, f"{path} is over 400 lines"
