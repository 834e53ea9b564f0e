"""``[devices.*]`` and ``[backends.NAME]``: memory pools (:class:`DeviceConfig`)
and the model servers yard may start (:class:`BackendConfig`), and their readers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from yard.config.programs import LLAMA_SERVER
from yard.config.reading import (
    _GPU,
    _NAME,
    PLACEHOLDERS,
    _as_toml_list,
    _expand,
    _kind,
    _non_empty,
    _non_negative,
    _path,
    _placeholders,
    _positive,
    _Reader,
    _str_list,
    _url_path,
)
from yard.config.server import ServerConfig
from yard.core.spec import HOST, MAX_INSTANCE_LOAD_PENALTY, MAX_INSTANCES, instance_name

DEFAULT_STARTUP_TIMEOUT_S = 600.0
"""Start-up timeout of a backend whose load time was never measured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceConfig:
    """``[devices.host]`` / ``[devices.gpuN]``: settings of one memory pool."""

    name: str
    reserve_bytes: int = 0
    exclusive: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmupConfig:
    """A request sent once the health check passes, before the backend counts
    as ready; it should exercise the worst case (longest context), so that the
    memory profile measured on first load is the real peak."""

    method: str = "POST"
    path: str = "/"
    json: object = None


FillContext = bool | Literal["auto"]
"""``warmup.fill_context``: whether a measured first load is driven to a full
context before it counts as ready (``"auto"``: when the command looks like
llama.cpp's server)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendConfig:
    """``[backends.NAME]``: one model server yard may start and stop.

    command: argv (never a shell), with placeholders (see :data:`PLACEHOLDERS`).
    api: ``"openai"`` (routed by the ``model`` field) or ``"plain"`` (reached
        at ``/backends/NAME/...``).
    startup_timeout_s: None: derived from the measured load time
        (:meth:`startup_timeout`).
    stop_grace_s: time between SIGTERM and SIGKILL.
    fill_context: on a measured first load, fill a slot's whole context after
        the warm-up (True, False, or ``"auto"``: llama-server only); see
        :func:`yard.supervisor.fills_context`.
    context: the context sizes it may start with (min, max), given to its
        command as ``{context}``; each start gets the largest that fits
        (:mod:`yard.core.resources`). None: no range.
    parallel: the slot counts it may start with (min, max), given to its
        command as ``{parallel}`` (and ``{total_context}``, context x slots);
        each start gets the most that fit once its context is at its maximum,
        and ``slots`` is then the range's minimum (the estimate before a start).
        None: no range.
    instances: how many processes of it yard may run at once (``instances =
        N``, 1 to :data:`~yard.core.spec.MAX_INSTANCES`). The table's backend is
        the first; :class:`~yard.config.Config` holds the others too, as
        ``NAME@2`` ... ``NAME@N`` with ``instance_of`` set: each starts with its
        own ``{port}`` and its own GPUs, and the core routes the model's requests
        among them (:mod:`yard.core.instances`).
    instance_of: on ``NAME@K``, ``NAME`` (None on the first).
    instance_load_penalty: ``[scheduler] instance_load_penalty`` for this
        backend's instances alone (None: the scheduler's).
    spread_windows: with ``instances > 1``, announcements and held work ready
        the further instances ahead of their windows too (see
        :attr:`yard.core.spec.BackendSpec.spread_windows`).
    """

    name: str
    models: tuple[str, ...]
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    health_path: str = "/health"
    startup_timeout_s: float | None = None
    idle_ttl_s: float | None = None
    slots: int = 1
    gpus: tuple[str, ...] = ()
    gpu_count: int = 1
    pinned: bool = False
    api: Literal["openai", "plain"] = "openai"
    warmup: WarmupConfig | None = None
    model_file: Path | None = None
    stop_grace_s: float = 10.0
    fill_context: FillContext = "auto"
    context: tuple[int, int] | None = None
    parallel: tuple[int, int] | None = None
    instances: int = 1
    instance_of: str | None = None
    instance_load_penalty: float | None = None
    spread_windows: bool = False
    path_templates: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """``cwd`` / ``model_file`` as written in the file (before placeholders)."""

    def relocated(self, config_dir: Path, data_dir: Path) -> BackendConfig:
        """The same backend with ``{data_dir}`` in ``cwd`` / ``model_file``
        pointing at ``data_dir``."""
        t = self.path_templates
        return dataclasses.replace(
            self,
            cwd=_expand(t["cwd"], config_dir, data_dir) if "cwd" in t else self.cwd,
            model_file=(
                _expand(t["model_file"], config_dir, data_dir)
                if "model_file" in t
                else self.model_file
            ),
        )

    def startup_timeout(self, load_s: float | None) -> float:
        """How long a start may take before it counts as failed.

        The configured ``startup_timeout_s`` if set; otherwise
        ``max(60, 3 × load_s)`` from the measured load time, or
        :data:`DEFAULT_STARTUP_TIMEOUT_S` while it was never measured.
        """
        if self.startup_timeout_s is not None:
            return self.startup_timeout_s
        if load_s is None:
            return DEFAULT_STARTUP_TIMEOUT_S
        return max(60.0, 3.0 * load_s)

    def gpu_indices(self, gpus: tuple[str, ...]) -> str:
        """``("gpu0", "gpu2")`` -> ``"0,2"`` (for CUDA_VISIBLE_DEVICES and {gpus})."""
        return ",".join(gpu.removeprefix("gpu") for gpu in gpus)


DEVICE_KEYS = ("reserve", "exclusive")

BACKEND_KEYS = (
    "models",
    "command",
    "env",
    "cwd",
    "health_path",
    "startup_timeout_s",
    "idle_ttl_s",
    "slots",
    "gpus",
    "gpu_count",
    "pinned",
    "api",
    "warmup",
    "model_file",
    "stop_grace_s",
    "context",
    "parallel",
    "instances",
    "instance_load_penalty",
    "spread_windows",
)

WARMUP_KEYS = ("method", "path", "json", "fill_context")


def _load_penalty(value: float) -> str | None:
    if 0 <= value <= MAX_INSTANCE_LOAD_PENALTY:
        return None
    return (
        f"must be between 0 and {MAX_INSTANCE_LOAD_PENALTY:g} (the fraction of a further "
        f"instance's start counted against loading it), got {value}"
    )


def _context(
    r: _Reader,
    table: dict[str, Any],
    key: str,
    command: Sequence[str],
    env: Mapping[str, str],
) -> tuple[int, int] | None:
    """``context = { min = 4096, max = 32768 }``: a range the core chooses
    from at each start, which the command must use as ``{context}``."""
    # {total_context} (context x parallel slots) uses the context too.
    names = ("{context}", "{total_context}")
    uses = any(n in text for text in (*command, *env.values()) for n in names)
    if "context" not in table:
        if uses:
            r.error(
                f"{key}.command",
                "uses {context} but the backend has no context range; add e.g. "
                "context = { min = 4096, max = 32768 }",
            )
        return None
    found = _min_max(r, f"{key}.context", table["context"], "token")
    if found is None:
        return None
    if not uses:
        r.error(
            f"{key}.context",
            "is set but the command never uses {context}; pass it to the server, "
            'e.g. "-c", "{context}" for llama-server',
        )
        return None
    return found


def _min_max(r: _Reader, field: str, span: object, unit: str) -> tuple[int, int] | None:
    """A ``{ min = N, max = M }`` range of whole ``unit`` counts with
    ``1 <= N <= M``; None (the error said, of ``field``) if it is not one."""
    if not isinstance(span, dict) or set(span) != {"min", "max"}:
        r.error(field, f"must be a table {{ min = N, max = M }} of {unit} counts, got {span!r}")
        return None
    low, high = span["min"], span["max"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)):
        r.error(field, f"min and max must be whole {unit} counts, got {span!r}")
        return None
    if not 1 <= low <= high:
        r.error(field, f"needs 1 <= min <= max, got min = {low}, max = {high}")
        return None
    return (low, high)


def _parallel(
    r: _Reader,
    table: dict[str, Any],
    key: str,
    command: Sequence[str],
    env: Mapping[str, str],
    context: tuple[int, int] | None,
) -> tuple[int, int] | None:
    """``parallel = { min = 1, max = 8 }``: a slot-count range the core chooses
    from at each start (after the context), which the command must use as
    ``{parallel}``. It replaces ``slots`` (both is an error naming both); a
    ``{total_context}`` (context x slots, llama-server's ``-c`` when each slot
    gets ``{context}``) needs both ranges."""
    texts = (*command, *env.values())
    uses = any("{parallel}" in text for text in texts)
    total = any("{total_context}" in text for text in texts)
    if total and (context is None or "parallel" not in table):
        r.error(
            f"{key}.command",
            "uses {total_context} (context x parallel slots) but the backend lacks a "
            "context or a parallel range; add both, e.g. context = { min = 4096, max = 16384 } "
            "and parallel = { min = 1, max = 4 }",
        )
    if "parallel" not in table:
        if uses:
            r.error(
                f"{key}.command",
                "uses {parallel} but the backend has no parallel range; add e.g. "
                "parallel = { min = 1, max = 4 }",
            )
        return None
    if "slots" in table:
        r.error(
            f"{key}.slots",
            "and parallel are both set: with a parallel range each start serves as many "
            "requests at once as the slots it got; remove slots",
        )
        return None
    found = _min_max(r, f"{key}.parallel", table["parallel"], "slot")
    if found is None:
        return None
    if not uses:
        # {total_context} alone would grow the memory without the server
        # serving that many at once.
        r.error(
            f"{key}.parallel",
            "is set but the command never uses {parallel}; pass it to the server, "
            'e.g. "-np", "{parallel}" for llama-server',
        )
        return None
    return found


def _devices(r: _Reader, data: dict[str, Any]) -> dict[str, DeviceConfig]:
    devices = {}
    for name in data:
        key = f"devices.{name}"
        if name != HOST and not _GPU.match(name):
            r.error(key, f"devices are called {HOST!r} or 'gpu0', 'gpu1', ...; got {name!r}")
            continue
        table = r.table(data, "devices", name)
        r.known(table, key, DEVICE_KEYS)
        devices[name] = DeviceConfig(
            name=name,
            reserve_bytes=r.size(table, key, "reserve", 0),
            exclusive=r.get(table, key, "exclusive", bool, False),
        )
    return devices


def _backends(
    r: _Reader,
    data: dict[str, Any],
    server: ServerConfig,
) -> dict[str, BackendConfig]:
    backends: dict[str, BackendConfig] = {}
    owner_of_model: dict[str, str] = {}
    for name in data:
        key = f"backends.{name}"
        if not _NAME.match(name):
            r.error(key, "backend names use letters, digits, '_', '.', '-' (they appear in URLs)")
        table = r.table(data, "backends", name)
        r.known(table, key, BACKEND_KEYS)
        backend = _backend(r, name, key, table, server)
        if backend is None:
            continue
        backends[name] = backend
        # The further instances come right after the first (Config.models()
        # and backend_for_model() name the first only).
        for k in range(2, backend.instances + 1):
            other = instance_name(name, k)
            backends[other] = dataclasses.replace(backend, name=other, instance_of=name)
        for model in backend.models:
            if model in owner_of_model:
                r.error(
                    f"{key}.models",
                    f"model {model!r} is already served by backend {owner_of_model[model]!r}; "
                    "a model name must lead to one backend",
                )
            else:
                owner_of_model[model] = name
    return backends


def _backend(
    r: _Reader, name: str, key: str, table: dict[str, Any], server: ServerConfig
) -> BackendConfig | None:
    ok = True
    api = r.get(table, key, "api", str, "openai")
    if api not in ("openai", "plain"):
        r.error(f"{key}.api", f"must be 'openai' (routed by model) or 'plain', got {api!r}")
        api = "openai"

    models = _str_list(r, table, key, "models")
    if api == "openai" and not models and not isinstance(table.get("models", []), str):
        what = "is missing" if "models" not in table else "is empty"
        r.error(
            f"{key}.models",
            f"{what}: an openai backend is reached by the model names apps send, "
            'e.g. models = ["llama-3-8b"] (or api = "plain")',
        )
        ok = False

    command: tuple[str, ...] = ()
    if "command" not in table:
        r.error(f"{key}.command", 'is missing: the argv to start it, e.g. ["llama-server", ...]')
        ok = False
    elif isinstance(table["command"], str):
        r.error(
            f"{key}.command",
            "must be a list of arguments (argv), never a shell line; "
            f"e.g. command = {_as_toml_list(table['command'].split())}",
        )
        ok = False
    else:
        command = _str_list(r, table, key, "command")
        if not command:
            r.error(f"{key}.command", "must not be empty")
            ok = False
        for i, arg in enumerate(command):
            problem = _placeholders(arg, PLACEHOLDERS)
            if problem:
                r.error(f"{key}.command[{i}]", problem)
            elif LLAMA_SERVER in arg and (i > 0 or arg != LLAMA_SERVER):
                r.error(
                    f"{key}.command[{i}]",
                    f"{LLAMA_SERVER} stands alone as the first word of command, e.g. "
                    f'command = ["{LLAMA_SERVER}", "--port", "{{port}}", ...]',
                )

    env: dict[str, str] = {}
    env_table = r.get(table, key, "env", dict, {})
    for var, value in env_table.items():
        if not isinstance(value, str):
            r.error(f"{key}.env.{var}", f"must be a string, got {_kind(value)}")
            continue
        problem = _placeholders(value, PLACEHOLDERS)
        if not problem and LLAMA_SERVER in value:
            problem = f"{LLAMA_SERVER} is for the first word of command only"
        if problem:
            r.error(f"{key}.env.{var}", problem)
            continue
        env[var] = value

    cwd_text = r.get(table, key, "cwd", str, "", _non_empty)
    cwd = _path(r, f"{key}.cwd", cwd_text, server.data_dir) if cwd_text else None
    model_file_text = r.get(table, key, "model_file", str, "", _non_empty)
    model_file = (
        _path(r, f"{key}.model_file", model_file_text, server.data_dir) if model_file_text else None
    )
    if model_file is None and any("{model_file}" in arg for arg in command):
        r.error(f"{key}.command", "uses {model_file} but the backend has no model_file")

    health_path = r.get(table, key, "health_path", str, "/health", _url_path)

    gpus: tuple[str, ...] = ()
    raw_gpus = table.get("gpus", [])
    if not isinstance(raw_gpus, list):
        r.error(f"{key}.gpus", f'must be a list such as ["gpu0"] or [0, 1], got {_kind(raw_gpus)}')
    else:
        names = []
        for i, gpu in enumerate(raw_gpus):
            if isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0:
                names.append(f"gpu{gpu}")
            elif isinstance(gpu, str) and _GPU.match(gpu):
                names.append(gpu)
            else:
                r.error(f"{key}.gpus[{i}]", f"must be 'gpuN' or an index N, got {gpu!r}")
        if len(set(names)) != len(names):
            r.error(f"{key}.gpus", "lists a GPU twice")
        else:
            gpus = tuple(names)
    gpu_count = r.get(table, key, "gpu_count", int, 1)
    if gpus and not 1 <= gpu_count <= len(gpus):
        r.error(
            f"{key}.gpu_count",
            f"must be between 1 and the {len(gpus)} GPUs listed in gpus, got {gpu_count}",
        )
        gpu_count = 1
    elif not gpus and "gpu_count" in table:
        r.error(f"{key}.gpu_count", "is set but gpus is empty; list the GPUs it may use")

    warmup = None
    fill_context: FillContext = "auto"
    if "warmup" in table:
        w = r.get(table, key, "warmup", dict, {})
        wkey = f"{key}.warmup"
        r.known(w, wkey, WARMUP_KEYS)
        if "fill_context" in w:
            fill = w["fill_context"]
            if isinstance(fill, bool) or fill == "auto":
                fill_context = fill
            else:
                r.error(
                    f"{wkey}.fill_context",
                    f'must be true, false or "auto" (llama-server only), got {_kind(fill)}',
                )
        request = {k: v for k, v in w.items() if k != "fill_context"}
        if request:
            method = r.get(w, wkey, "method", str, "POST").upper()
            if method not in ("GET", "POST", "PUT"):
                r.error(f"{wkey}.method", f"must be GET, POST or PUT, got {method!r}")
            if "path" not in w:
                r.error(
                    f"{wkey}.path",
                    "is missing: the path to request, e.g. /v1/completions "
                    "(a warm-up table with only fill_context sends no request)",
                )
            warmup = WarmupConfig(
                method=method,
                path=r.get(w, wkey, "path", str, "/", _url_path),
                json=w.get("json"),
            )

    context = _context(r, table, key, command, env)
    parallel = _parallel(r, table, key, command, env, context)

    slots = r.get(table, key, "slots", int, 1)
    if slots < 1:
        r.error(f"{key}.slots", f"must be at least 1, got {slots}")
        slots = 1
    if parallel is not None:
        slots = parallel[0]
    instances = r.get(table, key, "instances", int, 1)
    if not 1 <= instances <= MAX_INSTANCES:
        r.error(
            f"{key}.instances",
            f"must be between 1 and {MAX_INSTANCES} (processes of this backend yard may "
            f"run at once), got {instances}",
        )
        instances = 1
    if not ok:
        return None
    return BackendConfig(
        name=name,
        models=models,
        command=command,
        env=env,
        cwd=cwd,
        health_path=health_path,
        startup_timeout_s=r.optional(table, key, "startup_timeout_s", _positive),
        idle_ttl_s=r.optional(table, key, "idle_ttl_s", _positive),
        slots=slots,
        gpus=gpus,
        gpu_count=gpu_count,
        pinned=r.get(table, key, "pinned", bool, False),
        api=api,  # type: ignore[arg-type]
        warmup=warmup,
        context=context,
        parallel=parallel,
        instances=instances,
        instance_load_penalty=r.optional(table, key, "instance_load_penalty", _load_penalty),
        spread_windows=r.get(table, key, "spread_windows", bool, False),
        model_file=model_file,
        path_templates={
            key: text for key, text in (("cwd", cwd_text), ("model_file", model_file_text)) if text
        },
        stop_grace_s=r.get(table, key, "stop_grace_s", float, server.stop_grace_s, _non_negative),
        fill_context=fill_context,
    )
