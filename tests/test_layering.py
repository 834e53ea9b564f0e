"""The rooms keep their doors: the core does no I/O (STYLE.md, rule 1)."""

from __future__ import annotations

import ast
from pathlib import Path

import yard.core

FORBIDDEN = {
    "asyncio",
    "httpcore",
    "httpx",
    "hypercorn",
    "os",
    "psutil",
    "pynvml",
    "quart",
    "quart_trio",
    "random",
    "signal",
    "socket",
    "sqlite3",
    "subprocess",
    "threading",
    "time",
    "trio",
    "yard.engine",
    "yard.http",
    "yard.memory",
    "yard.store",
    "yard.supervisor",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _is_forbidden(module: str) -> bool:
    return any(module == bad or module.startswith(bad + ".") for bad in FORBIDDEN)


def test_core_imports_nothing_that_does_io() -> None:
    core_dir = Path(yard.core.__file__).parent
    files = sorted(core_dir.rglob("*.py"))
    assert files, "the core package has no modules?"
    offenders = {
        f"{path.relative_to(core_dir)}: {module}"
        for path in files
        for module in _imports(path)
        if _is_forbidden(module)
    }
    assert not offenders, f"yard/core must stay pure, but imports: {sorted(offenders)}"


def test_layering_check_would_catch_a_trio_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import trio.lowlevel\nfrom time import monotonic\n")
    assert {m for m in _imports(bad) if _is_forbidden(m)} == {"trio.lowlevel", "time"}
