"""The rooms keep their doors (``docs/architecture.md``).

- Each package of yard imports only packages of the layers below its own
  (:data:`LAYERS`, bottom first; runtime imports, those under
  ``if TYPE_CHECKING:`` left out), so that no two packages import each other
  and a room can be read, tested and replaced from the bottom up. A new
  package is placed in a layer before it can land.
- ``yard/core`` imports the standard library and ``yard.core`` only, and of the
  standard library nothing that does I/O, reads the clock or draws random
  numbers: an allow-list, so that a new dependency is a decision, not an
  accident.
- No import cycle among yard's modules either.
- Nothing outside ``tests/`` (yard, the benchmarks, the simulator) imports a
  module of the tests: what a benchmark shares with them lives in
  ``yard/testing/``.
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


def _test_imports(root: Path) -> list[str]:
    """``path: module`` for every import of the tests' package under ``root``."""
    return sorted(
        f"{path.relative_to(root)}: {module}"
        for top in ("yard", "bench", "sim")
        for path in sorted((root / top).rglob("*.py"))
        for module, _ in _imports(path, ".".join(path.relative_to(root).parent.parts))
        if module == "tests" or module.startswith("tests.")
    )


def test_nothing_outside_the_tests_imports_a_test_module() -> None:
    offenders = _test_imports(Path(yard.__file__).parent.parent)
    assert not offenders, (
        f"imports of the tests (move what they share to yard/testing): {offenders}"
    )


def test_the_test_import_check_finds_a_lazy_import_in_a_benchmark(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "b.py").write_text(
        "def run() -> None:\n    from tests.cluster.test_nodes import CHAT\n"
    )
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "s.py").write_text("import testsuite\n")
    assert _test_imports(tmp_path) == ["bench/b.py: tests.cluster.test_nodes"]


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


LAYERS: tuple[frozenset[str], ...] = (
    # Which scheduler core runs (compiled or plain): the root imports it before
    # anything imports the core, and it reads only files and the environment.
    frozenset({"compiled"}),
    # Leaves: the root (the version), the one refusal, RFC 3339 times, and the
    # HTTP/1.1 library, which imports nothing of yard but itself.
    frozenset({"yard", "errors", "times", "h1"}),
    frozenset({"core"}),
    frozenset({"config"}),
    frozenset({"ports", "admission", "db", "datadir"}),
    frozenset({"engine", "target", "keys"}),
    frozenset({"memory"}),
    frozenset({"supervisor", "testing"}),
    # Durable work, then what builds on it.
    frozenset({"jobs", "announce", "modelfolder", "demo"}),
    frozenset({"batches"}),
    frozenset({"cluster"}),
    # The HTTP side: the APIs (parsing, errors, keys, the routes of jobs,
    # batches and announcements), observability, the data plane.
    frozenset({"api"}),
    frozenset({"observe"}),
    frozenset({"http"}),
    # The composition root and the commands.
    frozenset({"app", "init", "status"}),
    frozenset({"models_cli"}),
    frozenset({"cli", "build_core"}),
)
"""yard's packages (and top-level modules) by layer, bottom first: each may
import only packages of lower layers (``docs/architecture.md`` says why each
stands where it does)."""


def _runtime_imports(path: Path, package: str) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names) for every import that runs: the ones under
    ``if TYPE_CHECKING:`` are for the type checker only and left out."""
    tree = ast.parse(path.read_text(), filename=str(path))

    def walk(body: list[ast.stmt]) -> Iterator[tuple[int, str, tuple[str, ...]]]:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.orelse)
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield node.lineno, alias.name, ()
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    module = f"{base}.{module}" if module else base
                yield node.lineno, module, tuple(alias.name for alias in node.names)
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    for child in inner:
                        if isinstance(child, ast.ExceptHandler | ast.match_case):
                            yield from walk(child.body)
                    yield from walk([c for c in inner if isinstance(c, ast.stmt)])

    yield from walk(tree.body)


def _package(module: str) -> str | None:
    """The package (or top-level module) of yard that ``module`` belongs to:
    ``yard.http.gateway`` -> ``http``, ``yard.errors`` -> ``errors``, ``yard`` ->
    ``yard``; None outside yard."""
    parts = module.split(".")
    if parts[0] != "yard":
        return None
    return parts[1] if len(parts) > 1 else "yard"


def _package_imports(root: Path) -> list[tuple[str, str, str]]:
    """(importer, imported, where) for every runtime import from one of yard's
    packages into another; ``where`` is ``path:line -> module``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = _module_name(path, root)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        source = _package(name)
        assert source is not None
        for line, module, names in _runtime_imports(path, package):
            target = _package(module)
            if module == "yard" and names:
                # "from yard import x": the package x, unless x is a name of the root.
                subs = {n for n in names if (root / n).is_dir() or (root / f"{n}.py").is_file()}
                targets = subs or {"yard"}
            else:
                targets = {target} if target is not None else set()
            for each in targets:
                if each != source:
                    where = f"{path.relative_to(root.parent)}:{line} -> {module}"
                    found.append((source, each, where))
    return found


def _against_the_layers(
    imports: list[tuple[str, str, str]], layers: tuple[frozenset[str], ...]
) -> tuple[set[str], list[str]]:
    """(packages in no layer, imports that do not go down a layer)."""
    rank = {package: k for k, layer in enumerate(layers) for package in layer}
    unplaced = {p for source, target, _ in imports for p in (source, target) if p not in rank}
    wrong = [
        f"{where} ({source} is in layer {rank[source]}, {target} in layer {rank[target]})"
        for source, target, where in imports
        if source in rank and target in rank and rank[target] >= rank[source]
    ]
    return unplaced, wrong


def test_every_package_of_yard_stands_in_a_layer() -> None:
    root = Path(yard.__file__).parent
    packages = {_package(_module_name(p, root)) for p in root.rglob("*.py")}
    placed = frozenset().union(*LAYERS)
    assert packages - placed == set(), "place every package in LAYERS (docs/architecture.md)"
    assert placed - packages == set(), "LAYERS names a package that is gone"


def test_every_import_between_packages_goes_down_the_layers() -> None:
    root = Path(yard.__file__).parent
    unplaced, wrong = _against_the_layers(_package_imports(root), LAYERS)
    assert not unplaced
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_no_import_cycle_among_yards_packages() -> None:
    root = Path(yard.__file__).parent
    graph: dict[str, set[str]] = {}
    for source, target, _ in _package_imports(root):
        graph.setdefault(source, set()).add(target)
    assert _cycles(graph) == []


def test_the_layer_check_catches_an_import_up_and_spares_the_type_checkers(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "yard"
    for sub in ("core", "engine", "http"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "loop.py").write_text("from yard.core import queue\n")
    (pkg / "core" / "queue.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from yard.http import gateway\n"
        "def f() -> None:\n    from ..engine import loop\n"
    )
    (pkg / "http" / "gateway.py").write_text("import yard.engine.loop\n")
    layers = (frozenset({"yard", "core"}), frozenset({"engine"}), frozenset({"http"}))
    imports = _package_imports(pkg)
    assert sorted((s, t) for s, t, _ in imports) == [
        ("core", "engine"),
        ("engine", "core"),
        ("http", "engine"),
    ]
    unplaced, wrong = _against_the_layers(imports, layers)
    assert unplaced == set()
    assert wrong == ["yard/core/queue.py:5 -> yard.engine (core is in layer 0, engine in layer 1)"]
    graph = {"core": {"engine"}, "engine": {"core"}, "http": {"engine"}}
    assert _cycles(graph) == [["core", "engine"]]
    assert _against_the_layers(imports, layers[1:])[0] == {"core"}
