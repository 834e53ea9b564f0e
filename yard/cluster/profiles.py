"""Profiles shared by the nodes of a cluster: one measurement per GPU model.

The SQLite store (:mod:`yard.memory.profiles`) keys a profile by everything
that changes a footprint on *this* machine, down to file paths and
modification times. Across machines those differ while the footprint does
not: the same model file copied to two hosts has two mtimes, and ``gpu0``
on one host is ``gpu1`` on another. The cluster key
(:func:`cluster_key`) is built from the same parts with the host-specific
ones left out:

- the command and its arguments as configured, and the environment (hashed);
- the server executable and every file the command names by file name and
  size (not path, not mtime): a different build or quantisation has another
  size;
- the GPUs by model and capacity (the meter's labels), not by name, and how
  many the backend takes.

So a node with the same card, the same model file and the same command
finds the profile another node measured, and loads without measuring again:
a node's :class:`yard.memory.profiles.Profiles` is built with
``portable=cluster_key`` on the shared database.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from yard.memory.profiles import FootprintKey

__all__ = ["cluster_key"]

_KEY_VERSION = "cluster/1"


def _portable(identity: Any) -> Any:
    # {"path", "size", "mtime_ns"} -> [file name, size]; anything else as is.
    if isinstance(identity, dict) and "path" in identity:
        return [PurePath(str(identity["path"])).name, identity.get("size")]
    return identity


def cluster_key(local: FootprintKey) -> FootprintKey:
    """The cluster-wide key of a footprint, from its local key's parts (see
    the module docstring for what is left out, and why)."""
    parts = dict(local.parts)
    portable: dict[str, object] = {
        "key": _KEY_VERSION,
        "command": parts.get("command"),
        "env": parts.get("env"),
        "executable": _portable(parts.get("executable")),
        "server": _portable(parts.get("server")),
        "files": sorted(
            (_portable(identity) for identity in _mapping(parts.get("files")).values()),
            key=json.dumps,
        ),
        "gpus": sorted(
            str(pair[1]) for pair in _list(parts.get("gpus")) if isinstance(pair, list | tuple)
        ),
        "gpu_count": parts.get("gpu_count"),
    }
    canonical = json.dumps(portable, sort_keys=True, separators=(",", ":"))
    return FootprintKey(digest=hashlib.sha256(canonical.encode()).hexdigest(), parts=portable)


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
