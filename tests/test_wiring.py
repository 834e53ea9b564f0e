"""yard's parts are wired by typed fields and imports, not by probes."""

from __future__ import annotations

import ast
from pathlib import Path

import yard

ROOT = Path(yard.__file__).parent


def _production_modules() -> list[Path]:
    return [
        path
        for path in sorted(ROOT.rglob("*.py"))
        if path.relative_to(ROOT).parts[0] not in ("demo", "testing")
    ]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


def test_production_code_does_not_import_the_demo() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(n for n in _imports(path) if n.startswith("yard.demo"))
        for path in _production_modules()
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_no_module_imports_parts_of_yard_by_name_at_run_time() -> None:
    # importlib.import_module("yard....") hides a dependency from mypy and
    # from the layering test; the command line's table of subcommands is the
    # one place that loads modules by name (so that one broken subcommand
    # does not break the others).
    found = []
    for path in _production_modules():
        if path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
                and node.args
            ):
                continue
            name = node.args[0]
            # A third-party module by its literal name (pynvml) is fine.
            if not (isinstance(name, ast.Constant) and not str(name.value).startswith("yard")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
