"""The folder of models while yard runs: read each GGUF file's trained
context (:func:`yard.memory.prior.read_model_file`), build the folder's
backends for the GPUs this machine has, and look again when asked
(:mod:`yard.config.folder` has the rules).

A file's header is read once per (path, size, modification time): a rescan
of an unchanged folder reads nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from yard.config import Config
from yard.config.folder import ModelFile, backends_for, model_files
from yard.memory.prior import read_model_file

__all__ = ["scan", "trained_context"]

log = logging.getLogger("yard.models")

_seen: dict[tuple[Path, int, int], int | None] = {}


def trained_context(path: Path) -> int | None:
    """The context length ``path`` was trained with (``ARCH.context_length``
    in its GGUF header), or None when the file does not say or cannot be read
    (blocking: it reads the header)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    key = (path, stat.st_size, stat.st_mtime_ns)
    if key not in _seen:
        _seen[key] = _read_trained_context(path)
    return _seen[key]


def _read_trained_context(path: Path) -> int | None:
    try:
        return read_model_file(path).trained_context
    except OSError:
        return None


def scan(config: Config, gpus: Sequence[str]) -> tuple[Config, list[str]]:
    """``config`` with its folder's backends as the folder is now, and a line
    for each file skipped (blocking: it lists the folder and reads new
    files' headers). Without ``[models]``, ``config`` unchanged."""
    folder = config.folder
    if folder is None:
        return config, []
    files = [ModelFile(path=p, trained_context=trained_context(p)) for p in model_files(folder.dir)]
    taken = {
        model: b.name
        for b in config.backends.values()
        if b.name not in config.from_folder
        for model in (b.models or (b.name,))
    }
    backends, notes = backends_for(
        folder,
        files,
        gpus=tuple(sorted(g for g in gpus if g != "host")),
        taken=taken,
        server=config.server,
        path=config.path,
    )
    return config.with_folder(backends), notes
