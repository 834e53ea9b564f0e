"""``[models]`` and ``[defaults.llama]``: a folder of GGUF files is a
configuration.

Every ``*.gguf`` in ``[models] dir`` (or ``yard serve --models DIR``) is served
with no backend written by hand:

- **name**: the file's name without ``.gguf`` (``Qwen2.5-7B-Q4_K_M.gguf`` is
  the model ``Qwen2.5-7B-Q4_K_M``; characters a backend name may not hold
  become ``-``), plus its aliases (``[models] aliases``, ``--alias``). The
  backend has the model's name.
- **command**: one template for all, ``[defaults.llama]`` (any backend key but
  ``models`` and ``model_file``) over the built-in one, which runs
  ``{llama_server}`` (:mod:`yard.config.programs`) on ``{model_file}`` with the
  context yard chose (``-c {context}``) and one slot.
- **context range**: from the file's trained context (``min`` = the smaller
  of 2,048 and it, ``max`` = it) unless the template sets one.
- **GPUs**: every GPU found on the machine, unless the template lists some.

Skipped: split GGUF parts after the first (``-00002-of-00003.gguf``),
multimodal projectors (``mmproj*.gguf``), hidden files, and a file whose
model name a hand-written backend already serves (it wins; the skip is
reported). Files added or removed while yard runs appear and disappear at
the next rescan (``rescan_s``, or ``yard reload``).

This module lists the folder and builds the backends from what the caller
read in each file (:class:`ModelFile`); reading the files and knowing the
GPUs is the caller's (:mod:`yard.modelfolder`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yard.config.backends import BACKEND_KEYS, BackendConfig, _backend
from yard.config.reading import _NAME, _kind, _path, _Reader
from yard.config.server import ServerConfig

__all__ = [
    "DEFAULT_CONTEXT",
    "LLAMA_TEMPLATE",
    "MODELS_KEYS",
    "FolderConfig",
    "ModelFile",
    "backends_for",
    "model_files",
    "model_name",
]

LLAMA_TEMPLATE: Mapping[str, Any] = {
    "command": [
        "{llama_server}",
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--model",
        "{model_file}",
        "--alias",
        "{model}",
        "-c",
        "{context}",
        "-np",
        "1",
    ],
    "health_path": "/health",
    "idle_ttl_s": 900.0,
}
"""The built-in ``[defaults.llama]``: llama.cpp's server, one slot, the
context yard chooses within the file's range."""

DEFAULT_CONTEXT = 4096
"""The context of a file whose trained context cannot be read."""

MIN_CONTEXT = 2048
"""The low end of a folder model's context range (or its trained context, if smaller)."""

MODELS_KEYS = ("dir", "rescan_s", "aliases")

TEMPLATE_KEYS = tuple(k for k in BACKEND_KEYS if k not in ("models", "model_file"))

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})$")
_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class FolderConfig:
    """``[models]`` with its template.

    dir: the folder (absolute).
    rescan_s: seconds between two looks at the folder while yard runs (0:
        only on ``yard reload``).
    aliases: more names per model (by the name from its file).
    template: ``[defaults.llama]`` over :data:`LLAMA_TEMPLATE`, as TOML data.
    """

    dir: Path
    rescan_s: float = 10.0
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    template: Mapping[str, Any] = field(default_factory=lambda: dict(LLAMA_TEMPLATE))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFile:
    """A GGUF file of the folder and what its header says (None: unknown)."""

    path: Path
    trained_context: int | None = None


def model_name(path: Path) -> str:
    """The model name a file gives: its name less ``.gguf`` (and a split
    file's ``-00001-of-00003``), with what a name may not hold as ``-``."""
    stem = _SPLIT.sub("", path.name.removesuffix(".gguf"))
    name = _BAD.sub("-", stem).strip("-.") or "model"
    return name if _NAME.match(name) else f"m{name}"


def model_files(folder: Path) -> list[Path]:
    """The GGUF files of ``folder`` that are models, by name (first parts of
    split files; no projectors, no hidden files). Empty when it is missing."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    found = []
    for path in entries:
        name = path.name
        if not name.lower().endswith(".gguf") or name.startswith("."):
            continue
        if name.lower().startswith("mmproj"):
            continue
        split = _SPLIT.search(name[: -len(".gguf")])
        if split is not None and int(split.group(1)) != 1:
            continue
        if path.is_file():
            found.append(path)
    return found


def read_folder(
    r: _Reader, models: dict[str, Any], defaults: dict[str, Any], server: ServerConfig
) -> FolderConfig | None:
    """``[models]`` and ``[defaults]`` (only ``llama`` so far); None without
    ``[models]``. The template is checked once here, on a stand-in file, so
    that its mistakes are reported under ``defaults.llama``."""
    r.known(defaults, "defaults", ("llama",))
    template = dict(LLAMA_TEMPLATE)
    if "llama" in defaults:
        given = r.table(defaults, "defaults", "llama")
        r.known(given, "defaults.llama", TEMPLATE_KEYS)
        template.update(given)
    if not models:
        return None
    r.known(models, "models", MODELS_KEYS)
    text = r.get(models, "models", "dir", str, "")
    if not text:
        r.error("models.dir", 'is missing: the folder of GGUF files, e.g. dir = "models"')
        return None
    folder = _path(r, "models.dir", text, server.data_dir)
    rescan_s = r.get(models, "models", "rescan_s", float, 10.0)
    if rescan_s < 0:
        r.error("models.rescan_s", f"must not be negative (0: only on yard reload), got {rescan_s}")
        rescan_s = 10.0
    aliases = _aliases(r, models.get("aliases", {}))
    stand_in = ModelFile(path=Path("/stand-in.gguf"), trained_context=DEFAULT_CONTEXT)
    _build(r, "defaults.llama", "stand-in", (), stand_in, template, server)
    if folder is None:
        return None
    return FolderConfig(dir=folder, rescan_s=rescan_s, aliases=aliases, template=template)


def _aliases(r: _Reader, raw: object) -> dict[str, tuple[str, ...]]:
    if not isinstance(raw, dict):
        r.error(
            "models.aliases", f'must be a table {{ "file-name" = ["alias"] }}, got {_kind(raw)}'
        )
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for name, value in raw.items():
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            r.error(f"models.aliases.{name}", f"must be a name or a list of names, got {value!r}")
            continue
        out[name] = tuple(names)
    return out


def backends_for(
    folder: FolderConfig,
    files: Sequence[ModelFile],
    *,
    gpus: tuple[str, ...],
    taken: Mapping[str, str],
    server: ServerConfig,
    path: Path,
) -> tuple[dict[str, BackendConfig], list[str]]:
    """The backends serving ``files``, and a line for each file skipped.

    gpus: the GPUs found on the machine (a template without ``gpus`` may use
    any of them; none: the host). taken: model names hand-written backends
    serve, to the backend's name. path: the configuration file (for
    messages)."""
    r = _Reader(path, {})
    backends: dict[str, BackendConfig] = {}
    notes: list[str] = []
    owner: dict[str, str] = dict(taken)
    for file in files:
        name = model_name(file.path)
        names = (name, *(a for a in folder.aliases.get(name, ()) if a != name))
        clash = next((n for n in names if n in owner), None)
        if clash is not None or name in backends:
            notes.append(
                f"{file.path}: skipped: the model {clash or name!r} is already served by "
                f"backend {owner.get(clash or name, name)!r}"
            )
            continue
        before = len(r.errors)
        backend = _build(r, f"models.{name}", name, names, file, folder.template, server, gpus)
        if backend is None or len(r.errors) > before:
            notes.append(f"{file.path}: skipped: " + "; ".join(r.errors[before:]))
            continue
        backends[name] = backend
        owner.update(dict.fromkeys(names, name))
    return backends, notes


def _build(
    r: _Reader,
    key: str,
    name: str,
    names: tuple[str, ...],
    file: ModelFile,
    template: Mapping[str, Any],
    server: ServerConfig,
    gpus: tuple[str, ...] = (),
) -> BackendConfig | None:
    table: dict[str, Any] = {**template, "models": list(names or (name,))}
    table["model_file"] = str(file.path)
    if "context" not in table:
        trained = file.trained_context or DEFAULT_CONTEXT
        table["context"] = {"min": min(MIN_CONTEXT, trained), "max": trained}
    if "gpus" not in table and gpus:
        table["gpus"] = list(gpus)
    backend = _backend(r, name, key, table, server)
    if backend is None:
        return None
    return backend
