"""The scheduler core, compiled: the same source, built to C by mypyc.

``yard/core`` is plain, typed Python and stays so; it is the one source of
truth. ``python -m yard.build_core`` (``make setup`` runs it) compiles it
with mypyc, the compiler that ships with mypy, into ``yard/.compiled/<abi>/``
beside the package, with the SHA-256 of the sources it was built from. When
yard is imported, :func:`use` puts that build in front of the sources, but only
if it was built from exactly the sources on disk: an edited core, a checkout of
another commit or a build for another Python runs as plain Python until it is
built again, never as a stale build. ``YARD_CORE=pure`` forces plain Python
(the tests run the core both ways; the decisions are the same).

The compiled core makes the same decisions from the same events: mypyc keeps
Python's semantics for the typed code it compiles (ints never overflow, floats
are C doubles either way, dicts keep their order). It is 2-3x faster per event
(``python -m sim.bench_core varied`` prints both). What it does not keep: a
class of the core cannot be subclassed outside it, and replacing a function of
the core from outside (a test's ``monkeypatch``) does not change the calls the
compiled core makes to it; tests that need either are marked ``pure_core``.

``python -m yard.build_core status`` says which core yard runs and why.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PACKAGE = Path(__file__).resolve().parent
CORE = PACKAGE / "core"
SUFFIX = str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")
BUILDS = PACKAGE / ".compiled"
BUILD = BUILDS / SUFFIX.strip(".").replace(".", "-")
DIGEST = "SOURCES.sha256"
GROUP = "yard.core"
"""mypyc's shared library for the core is the module ``yard.core__mypyc``."""
ENV = "YARD_CORE"


def sources() -> list[Path]:
    """The core's modules, in a fixed order. ``__init__`` is left out: it only
    re-exports, and as plain Python it is what finds the compiled modules."""
    return sorted(p for p in CORE.glob("*.py") if p.name != "__init__.py")


def digest(paths: Sequence[Path]) -> str:
    """SHA-256 over the names and bytes of ``paths``."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def state(build: Path = BUILD) -> tuple[bool, str]:
    """(use the build, why): which core yard runs, in words."""
    if os.environ.get(ENV, "") == "pure":
        return False, f"plain Python ({ENV}=pure)"
    stamp = build / DIGEST
    if not stamp.is_file():
        return False, "plain Python (not compiled: `python -m yard.build_core`)"
    if stamp.read_text().strip() != digest(sources()):
        return False, (
            "plain Python (the compiled build is of other sources: "
            "`python -m yard.build_core` builds it again)"
        )
    return True, f"compiled with mypyc ({build})"


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``yard.core``'s modules (and mypyc's shared library) in the build."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def _load(name: str, file: Path) -> None:
    """Load the extension module ``name`` from ``file`` into ``sys.modules``."""
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"{file} is not a module")
    module = importlib.util.module_from_spec(spec)  # an extension is loaded here
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


ACTIVE: tuple[bool, str] = (False, "plain Python (yard.compiled.use() has not run)")
"""What :func:`use` chose for this process."""


def use(build: Path = BUILD) -> tuple[bool, str]:
    """Run the compiled core in this process if it is built from the sources on
    disk (see :func:`state`); call before ``yard.core`` is imported."""
    global ACTIVE
    ok, why = state(build)
    if ok and "yard.core.scheduler" in sys.modules:
        ok, why = False, "plain Python (yard.core was imported before the build was found)"
    if ok:
        where = build / "yard"
        files = {f"yard.{p.name[: -len(SUFFIX)]}": p for p in where.glob(f"*{SUFFIX}")}
        files |= {
            f"yard.core.{p.name[: -len(SUFFIX)]}": p for p in (where / "core").glob(f"*{SUFFIX}")
        }
        wanted = {f"yard.core.{p.stem}" for p in sources()}
        if not wanted <= files.keys():
            ok, why = False, f"plain Python (the build at {build} lacks modules)"
        else:
            finder = _Finder(files)
            sys.meta_path.insert(0, finder)
            try:  # the shared library holds all the compiled code: it must load
                _load(f"{GROUP}__mypyc", files[f"{GROUP}__mypyc"])
            except (ImportError, KeyError) as e:
                sys.meta_path.remove(finder)
                ok, why = False, f"plain Python (the build at {build} does not load: {e})"
    ACTIVE = (ok, why)
    return ACTIVE


def build(out: Path = BUILD, *, jobs: int | None = None) -> Path:
    """Compile the core into ``out`` (replacing what was there only once the
    new build is whole). Needs mypy (with mypyc), setuptools and a C compiler."""
    try:
        from mypyc.build import mypycify
        from setuptools import Distribution  # type: ignore[import-untyped]
    except ImportError as e:  # pragma: no cover - depends on the install
        raise SystemExit(
            f"compiling the core needs mypy and setuptools ({e}): pip install 'yard[compile]'"
        ) from e
    paths = sources()
    stamp = digest(paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        stage = Path(tmp) / "stage"
        here = Path.cwd()
        os.chdir(tmp)  # mypyc and setuptools write their work under the working directory
        try:
            exts = mypycify(
                [str(p) for p in paths],
                opt_level="3",
                group_name=GROUP,
            )
            dist = Distribution({"name": "yard-core-compiled", "ext_modules": exts})
            dist.verbose = False
            cmd = dist.get_command_obj("build_ext")
            cmd.build_lib = str(stage)
            cmd.build_temp = str(Path(tmp) / "temp")
            cmd.parallel = jobs or os.cpu_count() or 1
            dist.run_command("build_ext")
        finally:
            os.chdir(here)
        (stage / DIGEST).write_text(stamp + "\n")
        old = Path(tmp) / "old"
        if out.exists():
            out.rename(old)
        stage.rename(out)
    return out
