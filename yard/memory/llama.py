"""Finding llama.cpp's ``llama-server`` binary (:mod:`yard.config.programs`
does it; re-exported here for the profile store, whose footprint key names
the build of the server a backend really runs, :mod:`yard.memory.profiles`).
"""

from __future__ import annotations

from yard.config.programs import LLAMA_SERVER_ENV as ENV_VAR
from yard.config.programs import find_llama_server

__all__ = ["ENV_VAR", "find_llama_server"]
