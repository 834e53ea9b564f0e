"""The rooms keep their doors (STYLE.md, rule 1; DESIGN.md "Rooms").

- ``yard/core`` imports the standard library and ``yard.core`` only, and of the
  standard library nothing that does I/O, reads the clock or draws random
  numbers: an allow-list, so that a new dependency is a decision, not an
  accident.
- No import cycle among yard's modules: each room can be read, tested and
  replaced from the bottom up.
- No module over :data:`MAX_MODULE_LINES` lines except the HTTP wire codec: a
  module a newcomer cannot read in one sitting is split along its seams.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import yard
import yard.core

NO_IO_STDLIB = frozenset(
    {
        "__future__",
        "bisect",
        "collections",
        "dataclasses",
        "enum",
        "functools",
        "heapq",
        "itertools",
        "math",
        "operator",
        "typing",
    }
)
"""The standard library modules the core may use (none does I/O, reads the clock
or draws random numbers). Add to it only modules that keep that promise."""


def _imports(path: Path, package: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(module, names) for every import in ``path``; relative imports are resolved
    against ``package`` (the dotted package the file lives in)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            yield module, tuple(alias.name for alias in node.names)


def _allowed_in_core(module: str) -> bool:
    top = module.split(".")[0]
    if module == "yard.core" or module.startswith("yard.core."):
        return True
    return top in NO_IO_STDLIB and top in sys.stdlib_module_names | {"__future__"}


def test_core_imports_only_the_allowed_standard_library_and_itself() -> None:
    core_dir = Path(yard.core.__file__).parent
    files = sorted(core_dir.rglob("*.py"))
    assert files, "the core package has no modules?"
    offenders = sorted(
        f"{path.relative_to(core_dir)}: {module}"
        for path in files
        for module, _ in _imports(path, "yard.core")
        if not _allowed_in_core(module)
    )
    allowed = sorted(NO_IO_STDLIB)
    assert not offenders, f"yard/core may import only {allowed} and yard.core: {offenders}"


def test_the_allow_list_refuses_io_and_outside_rooms(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import trio.lowlevel\nfrom time import monotonic\nimport os\n"
        "from yard.engine import Engine\nfrom yard.core import queue\nimport heapq\n"
    )
    refused = {m for m, _ in _imports(bad, "yard.core") if not _allowed_in_core(m)}
    assert refused == {"trio.lowlevel", "time", "os", "yard.engine"}


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _graph(root: Path) -> dict[str, set[str]]:
    """Module -> the yard modules it imports (``from pkg import mod`` counts as
    importing ``pkg.mod`` when that is a module)."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for module, names in _imports(path, package):
            if module not in files:
                continue
            subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in files]
            if subs and len(subs) == len(names):
                edges.update(subs)
            else:
                edges.add(module)
                edges.update(subs)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_yards_modules() -> None:
    root = Path(yard.__file__).parent
    cycles = _cycles(_graph(root))
    assert not cycles, f"import cycles among yard's modules: {cycles}"


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "yard"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from yard.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from ..c import thing\n")
    (pkg / "c.py").write_text("import yard.a\nthing = 1\n")
    (pkg / "d.py").write_text("from yard import a\n")
    assert _cycles(_graph(pkg)) == [["yard.a", "yard.c", "yard.sub.b"]]


MAX_MODULE_LINES = 600
"""The most lines a module of yard may have (issue 11)."""

LONG_MODULES = frozenset({"yard/h1/wire.py"})
"""The exceptions: the HTTP/1.1 codec, one protocol read top to bottom and kept
honest by the differential tests against h11."""


def _too_long(root: Path) -> dict[str, int]:
    lengths = {
        path.relative_to(root.parent).as_posix(): len(path.read_text().splitlines())
        for path in sorted(root.rglob("*.py"))
    }
    return {
        name: lines
        for name, lines in lengths.items()
        if lines > MAX_MODULE_LINES and name not in LONG_MODULES
    }


def test_no_module_of_yard_over_600_lines_but_the_wire_codec() -> None:
    too_long = _too_long(Path(yard.__file__).parent)
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them): {too_long}"


def test_the_size_check_finds_a_long_module_and_spares_the_codec(tmp_path: Path) -> None:
    pkg = tmp_path / "yard"
    (pkg / "h1").mkdir(parents=True)
    (pkg / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (pkg / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (pkg / "h1" / "wire.py").write_text("x = 1\n" * 2000)
    assert _too_long(pkg) == {"yard/long.py": MAX_MODULE_LINES + 1}
