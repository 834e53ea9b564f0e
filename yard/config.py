"""The configuration: one TOML file, validated completely before anything starts.

Rules this module keeps:

- Every error is collected, not only the first; each names the file, the key
  path and what is wrong, and where possible what to do
  (``"yard.toml: backends.llm.slots: must be at least 1, got 0"``).
- Unknown keys are errors (a typo must not silently fall back to a default),
  with the nearest known key suggested.
- Secrets may come from the environment (``key_env``, ``admin_key_env``); a
  variable that is named but not set is an error that names it.
- With no app keys and no admin key, yard listens on loopback only: anybody on
  the network could otherwise use the GPU. With an admin key but no app keys
  too, unless ``server.allow_anonymous = true`` says the open data plane is
  meant (:func:`exposure` says who may use what).
- Paths in the file are relative to the file's own directory.

The loaded :class:`Config` is plain frozen data; :meth:`Config.backend_specs`
and :meth:`Config.device_specs` turn it into the records the core takes.

``yard check FILE`` (:func:`add_arguments` / :func:`run`) validates a file
without starting anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import fnmatch
import hashlib
import hmac
import ipaddress
import math
import os
import re
import shutil
import string
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from yard.core.spec import HOST, BackendSpec, DeviceSpec, SchedulerConfig

__all__ = [
    "PLACEHOLDERS",
    "AppConfig",
    "BackendConfig",
    "Config",
    "ConfigError",
    "DeviceConfig",
    "FillContext",
    "JobsConfig",
    "ServerConfig",
    "WarmupConfig",
    "add_arguments",
    "key_digest",
    "load_config",
    "parse_listen",
    "parse_size",
    "run",
    "summary",
    "warnings",
]

PLACEHOLDERS: Mapping[str, str] = {
    "port": "the free loopback port yard chose for this backend",
    "host": "the address it must listen on (127.0.0.1)",
    "model": "the first model name the backend serves",
    "model_file": "the backend's model_file, as an absolute path",
    "gpus": "the CUDA indices of the GPUs it was placed on, comma-separated",
    "data_dir": "yard's data directory, absolute",
    "config_dir": "the directory of the configuration file, absolute",
    "python": "the Python interpreter running yard (to start Python backends)",
}
"""Placeholders allowed in ``command`` and ``env`` values, with their meaning."""

PATH_PLACEHOLDERS = ("data_dir", "config_dir")
"""Placeholders allowed in ``cwd`` and ``model_file`` (known before any launch)."""

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_GPU = re.compile(r"^gpu(\d+)$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

T = TypeVar("T")

DEFAULT_STARTUP_TIMEOUT_S = 600.0
"""Start-up timeout of a backend whose load time was never measured."""


class ConfigError(Exception):
    """The configuration is invalid.

    ``errors``: every problem found, each ``"FILE: key.path: what is wrong,
    what to do"``.
    """

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


# -- the records --------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """``[server]``: how yard itself runs.

    listen_host, listen_port: where the HTTP gateway listens.
    data_dir: jobs, profiles, backend logs and pid files (absolute).
    admin_key: guards the admin API; None: no admin key (admin API from
        loopback only).
    max_body_bytes: largest request body accepted (413 above).
    default_priority: priority of requests from apps without their own default.
    stop_grace_s: default time between SIGTERM and SIGKILL for backends, and
        the grace given to in-flight requests at shutdown.
    log_level: yard's own log level.
    allow_anonymous: off loopback, let the data plane take requests without
        an app key (only when no app has one; the admin API still needs the
        admin key). False: such a configuration is refused.
    allowed_hosts: ``Host`` names yard answers to where the browser guard
        checks them (:mod:`yard.http.guard`); None: the default for the
        listen address.
    allowed_origins: web pages of another origin that may send state-changing
        requests (``scheme://host[:port]``).
    dashboard_session_ttl_s: how long a dashboard login lasts.
    dashboard_login_max_bytes: largest login form body (413 above).
    admin_failures_before_delay: wrong admin keys a client may send before it
        must wait between tries.
    admin_failure_max_delay_s: longest such wait (it doubles per failure).
    keep_alive_s: how long a client connection may stay idle between requests.
    head_timeout_s: how long a request head may take to arrive (from the
        connection's start, or a later head's first byte); then 408.
    body_timeout_s: how long a request body may go without a byte; then 408.
    send_timeout_s: how long a client may take none of its answer before the
        request ends as cancelled (as if it had hung up).
    max_connections: client connections served at once (lowered at start
        to fit the open-file limit); at it, the connection waiting longest on
        its client makes room, and when none waits only ``/healthz`` and the
        admin key are served.
    reserved_connections: connections over ``max_connections`` kept for
        ``/healthz`` and the admin key; past them a connection gets 503.
    """

    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    data_dir: Path = Path("data")
    admin_key: str | None = None
    max_body_bytes: int = 64 * 2**20
    default_priority: float = 50.0
    stop_grace_s: float = 10.0
    log_level: str = "info"
    allow_anonymous: bool = False
    allowed_hosts: tuple[str, ...] | None = None
    allowed_origins: tuple[str, ...] = ()
    dashboard_session_ttl_s: float = 12 * 3600.0
    dashboard_login_max_bytes: int = 4096
    admin_failures_before_delay: int = 5
    admin_failure_max_delay_s: float = 300.0
    keep_alive_s: float = 75.0
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 30.0
    max_connections: int = 1000
    reserved_connections: int = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceConfig:
    """``[devices.host]`` / ``[devices.gpuN]``: settings of one memory pool."""

    name: str
    reserve_bytes: int = 0
    exclusive: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AppConfig:
    """``[apps.NAME]``: one client application, told apart by its API key.

    key: its API key (inline or from ``key_env``); ``""`` when the file holds
        only the key's hash.
    key_sha256: the SHA-256 digest of its key (32 bytes) when the file holds
        that instead (``key_sha256 = "HEX"``), else None.
    models: ``fnmatch`` patterns of the models it may use (``*``, ``?``,
        ``[seq]``, case-sensitive); None: every model. To this app, every
        other model does not exist.
    max_concurrent: most of its requests served at once, on all backends
        together (None: no limit); the rest wait in the queue.
    max_queued: most of its requests waiting at once, synchronous and jobs
        alike; one more is refused with 429 (None: only the scheduler's
        ``queue_limit``).
    weight: its share of GPU time relative to other apps at the same
        effective priority (1 for each app that sets none); validated, not
        yet used by the scheduler.
    """

    name: str
    key: str = ""
    key_sha256: bytes | None = None
    default_priority: float
    max_priority: float
    models: tuple[str, ...] | None = None
    max_concurrent: int | None = None
    max_queued: int | None = None
    weight: float = 1.0
    _scope: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # One compiled pattern for the whole list: a request costs one match.
        if self.models is not None:
            scope = "|".join(fnmatch.translate(p) for p in self.models) or "(?!)"
            object.__setattr__(self, "_scope", re.compile(scope))

    def may_use(self, model: str) -> bool:
        """Whether the app may use ``model`` (one of its ``models`` patterns matches)."""
        return self._scope is None or self._scope.match(model) is not None

    def may_reach(self, backend: BackendConfig) -> bool:
        """Whether the app may use ``backend`` at ``/backends/NAME/...``: it may
        use one of the backend's models, or, for a backend that names none,
        a pattern matches the backend's name."""
        if self._scope is None:
            return True
        return any(map(self.may_use, backend.models or (backend.name,)))

    def has_key(self, key: str, digest: bytes | None = None) -> bool:
        """Whether ``key`` is this app's key. ``digest``: ``key``'s
        :func:`key_digest` if the caller has it already. A hashed key is
        compared in constant time."""
        if self.key_sha256 is None:
            return bool(key) and key == self.key
        return hmac.compare_digest(key_digest(key) if digest is None else digest, self.key_sha256)


def key_digest(key: str) -> bytes:
    """The SHA-256 digest of an API key, as ``key_sha256`` holds it (of its
    UTF-8 bytes)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


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
class JobsConfig:
    """``[jobs]``: the settings of the job service (:mod:`yard.jobs`), which
    takes this record as it is.

    result_ttl_s: how long a finished job keeps its result; then it becomes
        ``expired`` and the bytes are deleted.
    record_ttl_s: how long an expired job is still listed, after that.
    max_result_bytes: the largest backend answer a job stores; a larger one
        fails the job with ``result_too_large``.
    max_request_bytes: the largest request body a job stores (None: the
        server's ``max_body_bytes`` already limits it).
    reap_interval_s: how often expired results are deleted.
    max_wait_s: the longest ``?wait=`` long-poll allowed.
    max_jobs_per_app: how many jobs one app may keep (queued, running, or
        ended and not yet expired); one more is refused with 429.
    max_stored_bytes_per_app: how many bytes one app's jobs may keep (request
        bodies until they end, then result bodies); past it, 507.
    batch_max_file_bytes: the largest file ``POST /v1/files`` takes (413 above).
    batch_max_files_per_app: how many uploaded files one app may keep (429 above).
    batch_max_lines: the most requests one batch input file may hold.
    batch_max_window_s: the longest ``completion_window`` a batch may ask for
        (any whole number of hours from ``1h`` up to this).
    batch_queued_lines: the most lines of one batch in the queue at once; the
        rest wait on disk and follow as these end.
    batch_priority_drop: batch lines run this far below their app's default
        priority while their batch is on schedule (at the default once behind).
    """

    result_ttl_s: float = 24 * 3600.0
    record_ttl_s: float = 7 * 24 * 3600.0
    max_result_bytes: int = 256 * 2**20
    max_request_bytes: int | None = None
    reap_interval_s: float = 60.0
    max_wait_s: float = 300.0
    max_jobs_per_app: int = 1000
    max_stored_bytes_per_app: int = 2 * 2**30
    batch_max_file_bytes: int = 50 * 2**20
    batch_max_files_per_app: int = 500
    batch_max_lines: int = 50_000
    batch_max_window_s: float = 7 * 24 * 3600.0
    batch_queued_lines: int = 64
    batch_priority_drop: float = 10.0


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """A validated configuration (see ``config/example.toml`` for every key)."""

    path: Path
    server: ServerConfig
    scheduler: SchedulerConfig
    devices: Mapping[str, DeviceConfig]
    apps: Mapping[str, AppConfig]
    backends: Mapping[str, BackendConfig]
    jobs: JobsConfig = field(default_factory=JobsConfig)

    @property
    def config_dir(self) -> Path:
        """The directory holding the file; relative paths start here."""
        return self.path.parent

    def backend_for_model(self, model: str) -> BackendConfig | None:
        """The openai-style backend serving ``model``, or None."""
        for backend in self.backends.values():
            if model in backend.models:
                return backend
        return None

    def app_for_key(self, key: str | None) -> AppConfig | None:
        """The app whose API key is ``key``, or None (no key, unknown key).

        Inline keys are compared first; ``key`` is hashed (once) only if no
        inline key matched and some app's key is held as a hash.
        """
        if not key:
            return None
        digest = None
        found = None
        for app in self.apps.values():
            if app.key_sha256 is None:
                if app.key == key:
                    return app
                continue
            if digest is None:
                digest = key_digest(key)
            # Every hash is compared, matched or not: the time does not
            # depend on which app's key it was.
            if hmac.compare_digest(digest, app.key_sha256):
                found = app
        return found

    def models(self) -> list[tuple[str, str]]:
        """Every (model, backend name), in file order."""
        return [(model, b.name) for b in self.backends.values() for model in b.models]

    def backend_specs(self) -> list[BackendSpec]:
        """The backends as the core sees them."""
        return [
            BackendSpec(
                name=b.name,
                gpus=b.gpus,
                gpu_count=b.gpu_count,
                slots=b.slots,
                idle_ttl_s=b.idle_ttl_s,
                pinned=b.pinned,
            )
            for b in self.backends.values()
        ]

    def device_specs(self, totals: Mapping[str, int]) -> list[DeviceSpec]:
        """The devices as the core sees them.

        ``totals`` maps each device the meter sees (``"host"``, ``"gpu0"``, ...)
        to its capacity in bytes. Every device in ``totals`` is returned, with
        its reserve and exclusivity from the file (none if not configured).

        Raises :class:`ConfigError` if the file names a GPU (under
        ``[devices]`` or in a backend's ``gpus``) that the meter does not see.
        """
        errors = []
        for name in self.devices:
            if name not in totals:
                errors.append(
                    f"{self.path}: devices.{name}: no such device on this machine "
                    f"(seen: {', '.join(sorted(totals)) or 'none'})"
                )
        for b in self.backends.values():
            for gpu in b.gpus:
                if gpu not in totals:
                    errors.append(
                        f"{self.path}: backends.{b.name}.gpus: {gpu} is not on this machine "
                        f"(seen: {', '.join(sorted(totals)) or 'none'}); without NVML yard "
                        "sees the host only"
                    )
        if errors:
            raise ConfigError(errors)
        specs = []
        for name, total in totals.items():
            device = self.devices.get(name, DeviceConfig(name=name))
            specs.append(
                DeviceSpec(
                    name=name,
                    kind="host" if name == HOST else "gpu",
                    total_bytes=total,
                    reserve_bytes=device.reserve_bytes,
                    exclusive=device.exclusive,
                )
            )
        return specs

    def with_overrides(self, *, listen: str | None = None, data_dir: Path | None = None) -> Config:
        """The same configuration with ``--listen`` / ``--data-dir`` applied
        (command-line values; a relative ``data_dir`` is relative to the current
        directory). Raises :class:`ConfigError` if the result breaks a rule (a
        non-loopback address with no keys)."""
        server = self.server
        errors: list[str] = []
        if listen is not None:
            try:
                host, port = parse_listen(listen)
            except ValueError as exc:
                raise ConfigError([f"--listen: {exc}"]) from None
            server = dataclasses.replace(server, listen_host=host, listen_port=port)
            _check_exposure(server, self.apps, errors, "--listen")
            if errors:
                raise ConfigError(errors)
        backends = self.backends
        if data_dir is not None:
            server = dataclasses.replace(server, data_dir=data_dir.resolve())
            # Paths written with {data_dir} follow the new data directory.
            backends = {
                name: b.relocated(self.config_dir, server.data_dir)
                for name, b in self.backends.items()
            }
        return dataclasses.replace(self, server=server, backends=backends)


# -- sizes, addresses ---------------------------------------------------------


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as ``"2GiB"``, ``"512 MiB"``,
    ``"1.5GB"``. Binary units: KiB MiB GiB TiB; decimal: KB MB GB TB.

    Raises ValueError with a message saying what is accepted.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 2GiB or a number of bytes, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            number, unit = match.groups()
            factor = _UNITS.get(unit.lower())
            if factor is not None:
                return int(float(number) * factor)
            raise ValueError(
                f"unknown unit {unit!r} in {value!r}; use B, KiB, MiB, GiB, TiB "
                "(or KB, MB, GB, TB for powers of ten)"
            )
    raise ValueError(f"expected a size like 2GiB or a number of bytes, got {value!r}")


def parse_listen(value: str) -> tuple[str, int]:
    """``"127.0.0.1:8080"`` / ``"[::1]:8080"`` / ``"localhost:8080"`` -> (host, port)."""
    if value.startswith("["):
        host, sep, port_text = value[1:].partition("]:")
    else:
        host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT such as 127.0.0.1:8080, got {value!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"the port in {value!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"the port in {value!r} is out of range (0-65535)")
    return host, port


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_exposure(
    server: ServerConfig, apps: Mapping[str, AppConfig], errors: list[str], where: str
) -> None:
    if apps or is_loopback(server.listen_host):
        return
    if server.admin_key is None:
        errors.append(
            f"{where}: {server.listen_host} is reachable from the network but no keys are "
            "configured; listen on 127.0.0.1, or set server.admin_key(_env) or give the apps "
            "keys under [apps.NAME]"
        )
    elif not server.allow_anonymous:
        errors.append(
            f"{where}: {server.listen_host} is reachable from the network and no app has a "
            "key, so anybody who can reach it may use every model (the admin key guards only "
            "the admin API); give the apps keys under [apps.NAME], listen on 127.0.0.1, or "
            "set server.allow_anonymous = true to serve without keys on purpose"
        )


def exposure(config: Config) -> list[str]:
    """Who may use yard with this configuration, one line per plane: what
    ``yard check`` prints and ``yard serve`` logs at start."""
    server = config.server
    where = f"{server.listen_host}:{server.listen_port}"
    local = is_loopback(server.listen_host)
    if config.apps:
        data = f"an app key required ({len(config.apps)} app(s))"
    elif local:
        data = f"no key needed, from this machine only ({where})"
    else:
        data = (
            f"NO KEY NEEDED: anybody who can reach {where} may use every model "
            "(server.allow_anonymous = true)"
        )
    if server.admin_key is not None:
        admin = "the admin key required"
    else:
        admin = "no key, from this machine only"
    return [f"data plane: {data}", f"admin API: {admin}"]


# -- the loader ---------------------------------------------------------------


class _Reader:
    """Walks the TOML tree, collecting every error with its key path."""

    def __init__(self, path: Path, env: Mapping[str, str]) -> None:
        self.path = path
        self.env = env
        self.errors: list[str] = []

    def error(self, key: str, message: str) -> None:
        self.errors.append(f"{self.path}: {key}: {message}")

    def table(self, data: Mapping[str, Any], key: str, name: str) -> dict[str, Any]:
        """The sub-table ``name`` of ``data`` (``{}`` if absent or wrong)."""
        value = data.get(name, {})
        if not isinstance(value, dict):
            self.error(
                _join(key, name), f"must be a table ([{_join(key, name)}]), got {_kind(value)}"
            )
            return {}
        return value

    def known(self, data: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> None:
        """Report every key of ``data`` not in ``allowed``, suggesting the nearest."""
        for name in data:
            if name not in allowed:
                near = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                self.error(
                    _join(key, name),
                    f"unknown key{hint} (known here: {', '.join(allowed)})",
                )

    def get(
        self,
        data: Mapping[str, Any],
        key: str,
        name: str,
        kind: type[T] | tuple[type, ...],
        default: T,
        check: Callable[[Any], str | None] | None = None,
    ) -> T:
        """``data[name]`` if present and of the right type, else ``default``
        (after recording an error if present but wrong)."""
        if name not in data:
            return default
        value = data[name]
        types = kind if isinstance(kind, tuple) else (kind,)
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        # TOML booleans are ints to Python; never accept one for a number.
        wrong_bool = isinstance(value, bool) and bool not in types
        if wrong_bool or not isinstance(value, types):
            self.error(_join(key, name), f"must be {_describe(types)}, got {_kind(value)}")
            return default
        if isinstance(value, float) and not math.isfinite(value):
            self.error(_join(key, name), f"must be a finite number, got {value}")
            return default
        if check is not None:
            problem = check(value)
            if problem:
                self.error(_join(key, name), problem)
                return default
        return cast(T, value)

    def optional(
        self, data: Mapping[str, Any], key: str, name: str, check: Callable[[Any], str | None]
    ) -> float | None:
        """An optional number: None when absent (or wrong, after an error)."""
        if name not in data:
            return None
        before = len(self.errors)
        value = self.get(data, key, name, float, 0.0, check)
        return value if len(self.errors) == before else None

    def size(self, data: Mapping[str, Any], key: str, name: str, default: int) -> int:
        if name not in data:
            return default
        try:
            return parse_size(data[name])
        except ValueError as exc:
            self.error(_join(key, name), str(exc))
            return default

    def secret(self, data: Mapping[str, Any], key: str, inline: str, from_env: str) -> str | None:
        """A secret given inline (``inline``) or by environment variable name
        (``from_env``); None if neither is given."""
        if inline in data and from_env in data:
            self.error(key, f"give either {inline} or {from_env}, not both")
            return None
        value = self.get(data, key, inline, str, "", _non_empty)
        if value:
            return value
        var = self.get(data, key, from_env, str, "", _non_empty)
        if not var:
            return None
        secret = self.env.get(var)
        if secret is None:
            self.error(
                _join(key, from_env),
                f"environment variable {var} is not set; export {var}=... before starting yard",
            )
            return None
        if not secret:
            self.error(_join(key, from_env), f"environment variable {var} is empty")
            return None
        return secret


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _kind(value: object) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }
    return f"{names.get(type(value), type(value).__name__)} ({value!r})"


def _describe(types: tuple[type, ...]) -> str:
    names = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }
    return " or ".join(names.get(t, t.__name__) for t in types)


def _non_empty(value: str) -> str | None:
    return None if value else "must not be empty"


def _positive(value: float) -> str | None:
    return None if value > 0 else f"must be greater than 0, got {value}"


def _non_negative(value: float) -> str | None:
    return None if value >= 0 else f"must not be negative, got {value}"


def _placeholders(text: str, allowed: tuple[str, ...] | Mapping[str, str]) -> str | None:
    """None if ``text`` is a valid format string using only ``allowed`` fields."""
    try:
        fields = [
            name for _, name, spec, conv in string.Formatter().parse(text) if name is not None
        ]
    except ValueError as exc:
        return f"{exc} in {text!r}; write {{{{ and }}}} for literal braces"
    for name in fields:
        if name not in allowed:
            near = difflib.get_close_matches(name, list(allowed), n=1)
            hint = f"; did you mean {{{near[0]}}}?" if near else ""
            return (
                f"unknown placeholder {{{name}}} in {text!r}{hint} "
                f"(known: {', '.join('{' + p + '}' for p in allowed)})"
            )
    return None


SERVER_KEYS = (
    "listen",
    "data_dir",
    "admin_key",
    "admin_key_env",
    "max_body_bytes",
    "default_priority",
    "stop_grace_s",
    "log_level",
    "allow_anonymous",
    "allowed_hosts",
    "allowed_origins",
    "dashboard_session_ttl_s",
    "dashboard_login_max_bytes",
    "admin_failures_before_delay",
    "admin_failure_max_delay_s",
    "keep_alive_s",
    "head_timeout_s",
    "body_timeout_s",
    "send_timeout_s",
    "max_connections",
    "reserved_connections",
)
DEVICE_KEYS = ("reserve", "exclusive")
APP_KEYS = (
    "key",
    "key_env",
    "key_sha256",
    "default_priority",
    "max_priority",
    "models",
    "max_concurrent",
    "max_queued",
    "weight",
)
APP_SECRETS = ("key", "key_env", "key_sha256")
_SHA256_HEX = re.compile(r"^[0-9a-fA-F]{64}$")
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
)
WARMUP_KEYS = ("method", "path", "json", "fill_context")
JOBS_KEYS = tuple(f.name for f in dataclasses.fields(JobsConfig))
TOP_KEYS = ("server", "scheduler", "devices", "apps", "backends", "jobs")
SCHEDULER_KEYS = tuple(f.name for f in dataclasses.fields(SchedulerConfig))


def load_config(path: Path, *, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate the TOML file at ``path``.

    ``env`` is where ``key_env`` / ``admin_key_env`` variables are looked up
    (default: ``os.environ``). Raises :class:`ConfigError` listing every
    problem found (including a missing file or a TOML syntax error).
    """
    if env is None:
        env = os.environ
    path = path.resolve() if path.is_absolute() else (Path.cwd() / path).resolve()
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such file"]) from None
    except IsADirectoryError:
        raise ConfigError([f"{path}: is a directory, not a TOML file"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot be read: {exc.strerror}"]) from None
    r = _Reader(path, env)
    config = _build(r, data)
    if r.errors:
        raise ConfigError(r.errors)
    return config


def _build(r: _Reader, data: dict[str, Any]) -> Config:
    r.known(data, "", TOP_KEYS)
    scheduler = _scheduler(r, r.table(data, "", "scheduler"))
    server = _server(r, r.table(data, "", "server"), scheduler)
    devices = _devices(r, r.table(data, "", "devices"))
    apps = _apps(r, r.table(data, "", "apps"), server, scheduler)
    backends = _backends(r, r.table(data, "", "backends"), server)
    jobs = _jobs(r, r.table(data, "", "jobs"), server)
    _check_app_models(r, apps, backends)
    if server.admin_key is not None:
        for app in apps.values():
            if app.has_key(server.admin_key):
                r.error(f"apps.{app.name}.key", "is the same as the admin key; give each its own")
    _check_exposure(server, apps, r.errors, f"{r.path}: server.listen")
    return Config(
        path=r.path,
        server=server,
        scheduler=scheduler,
        devices=devices,
        apps=apps,
        backends=backends,
        jobs=jobs,
    )


def _jobs(r: _Reader, data: dict[str, Any], server: ServerConfig) -> JobsConfig:
    r.known(data, "jobs", JOBS_KEYS)
    defaults = JobsConfig()
    max_result = r.size(data, "jobs", "max_result_bytes", defaults.max_result_bytes)
    if "max_result_bytes" in data and max_result == 0:
        r.error("jobs.max_result_bytes", "must be greater than 0")
    max_request: int | None = None
    if "max_request_bytes" in data:
        max_request = r.size(data, "jobs", "max_request_bytes", 0)
        if max_request == 0:
            r.error("jobs.max_request_bytes", "must be greater than 0 (or left out)")
            max_request = None
        elif max_request > server.max_body_bytes:
            r.error(
                "jobs.max_request_bytes",
                f"{max_request} is above server.max_body_bytes ({server.max_body_bytes}): "
                "larger requests are refused (413) before they become jobs; lower it, "
                "raise server.max_body_bytes, or leave it out",
            )
            max_request = None
    stored = r.size(data, "jobs", "max_stored_bytes_per_app", defaults.max_stored_bytes_per_app)
    if stored == 0:
        r.error("jobs.max_stored_bytes_per_app", "must be greater than 0")
        stored = defaults.max_stored_bytes_per_app
    return JobsConfig(
        result_ttl_s=r.get(data, "jobs", "result_ttl_s", float, defaults.result_ttl_s, _positive),
        record_ttl_s=r.get(
            data, "jobs", "record_ttl_s", float, defaults.record_ttl_s, _non_negative
        ),
        max_result_bytes=max_result,
        max_request_bytes=max_request,
        reap_interval_s=r.get(
            data, "jobs", "reap_interval_s", float, defaults.reap_interval_s, _positive
        ),
        max_wait_s=r.get(data, "jobs", "max_wait_s", float, defaults.max_wait_s, _non_negative),
        max_jobs_per_app=r.get(
            data, "jobs", "max_jobs_per_app", int, defaults.max_jobs_per_app, _positive
        ),
        max_stored_bytes_per_app=stored,
        **_batch_keys(r, data, server, defaults),
    )


def _batch_keys(
    r: _Reader, data: dict[str, Any], server: ServerConfig, defaults: JobsConfig
) -> dict[str, Any]:
    """The ``[jobs] batch_*`` keys (the Batch API, :mod:`yard.batches`)."""
    file_bytes = r.size(data, "jobs", "batch_max_file_bytes", defaults.batch_max_file_bytes)
    if file_bytes == 0:
        r.error("jobs.batch_max_file_bytes", "must be greater than 0")
        file_bytes = defaults.batch_max_file_bytes
    elif "batch_max_file_bytes" in data and file_bytes > server.max_body_bytes:
        r.error(
            "jobs.batch_max_file_bytes",
            f"{file_bytes} is above server.max_body_bytes ({server.max_body_bytes}): a larger "
            "upload is refused (413) before it is read; lower it or raise server.max_body_bytes",
        )
        file_bytes = defaults.batch_max_file_bytes
    window = r.get(
        data, "jobs", "batch_max_window_s", float, defaults.batch_max_window_s, _positive
    )
    if window < 3600.0:
        r.error("jobs.batch_max_window_s", f"must be at least 3600 (one hour), got {window:g}")
        window = defaults.batch_max_window_s
    return {
        "batch_max_file_bytes": file_bytes,
        "batch_max_files_per_app": r.get(
            data, "jobs", "batch_max_files_per_app", int, defaults.batch_max_files_per_app,
            _positive,
        ),
        "batch_max_lines": r.get(
            data, "jobs", "batch_max_lines", int, defaults.batch_max_lines, _positive
        ),
        "batch_max_window_s": window,
        "batch_queued_lines": r.get(
            data, "jobs", "batch_queued_lines", int, defaults.batch_queued_lines, _positive
        ),
        "batch_priority_drop": r.get(
            data, "jobs", "batch_priority_drop", float, defaults.batch_priority_drop,
            _non_negative,
        ),
    }


def _scheduler(r: _Reader, data: dict[str, Any]) -> SchedulerConfig:
    r.known(data, "scheduler", SCHEDULER_KEYS)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(SchedulerConfig):
        if f.name not in data:
            continue
        kind: type[int] | type[float] = int if f.type in ("int", int) else float
        before = len(r.errors)
        value = r.get(data, "scheduler", f.name, kind, 0)
        if len(r.errors) == before:
            values[f.name] = value
    try:
        return SchedulerConfig(**values)
    except ValueError as exc:
        r.error("scheduler", str(exc))
        return SchedulerConfig()


def _server(r: _Reader, data: dict[str, Any], scheduler: SchedulerConfig) -> ServerConfig:
    r.known(data, "server", SERVER_KEYS)
    defaults = ServerConfig()
    host, port = defaults.listen_host, defaults.listen_port
    listen = r.get(data, "server", "listen", str, "")
    if listen:
        try:
            host, port = parse_listen(listen)
        except ValueError as exc:
            r.error("server.listen", str(exc))
    data_dir_text = r.get(data, "server", "data_dir", str, str(defaults.data_dir), _non_empty)
    data_dir = _path(r, "server.data_dir", data_dir_text, None) or r.path.parent / "data"
    default_priority = r.get(data, "server", "default_priority", float, defaults.default_priority)
    if not scheduler.min_priority <= default_priority <= scheduler.max_priority:
        r.error(
            "server.default_priority",
            f"{default_priority} is outside the scheduler's range "
            f"[{scheduler.min_priority}, {scheduler.max_priority}]",
        )
    max_body = r.size(data, "server", "max_body_bytes", defaults.max_body_bytes)
    if "max_body_bytes" in data and max_body == 0:
        r.error("server.max_body_bytes", "must be greater than 0")
    level = r.get(data, "server", "log_level", str, defaults.log_level).lower()
    if level not in LOG_LEVELS:
        r.error("server.log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
        level = defaults.log_level
    return ServerConfig(
        listen_host=host,
        listen_port=port,
        data_dir=data_dir,
        admin_key=r.secret(data, "server", "admin_key", "admin_key_env"),
        max_body_bytes=max_body,
        default_priority=default_priority,
        stop_grace_s=r.get(
            data, "server", "stop_grace_s", float, defaults.stop_grace_s, _non_negative
        ),
        log_level=level,
        allow_anonymous=r.get(data, "server", "allow_anonymous", bool, False),
        allowed_hosts=_allowed_hosts(r, data),
        allowed_origins=_allowed_origins(r, data),
        dashboard_session_ttl_s=r.get(
            data, "server", "dashboard_session_ttl_s", float, 12 * 3600.0, _positive
        ),
        dashboard_login_max_bytes=_login_max_bytes(r, data),
        admin_failures_before_delay=r.get(
            data, "server", "admin_failures_before_delay", int, 5, _non_negative
        ),
        admin_failure_max_delay_s=r.get(
            data, "server", "admin_failure_max_delay_s", float, 300.0, _positive
        ),
        keep_alive_s=r.get(data, "server", "keep_alive_s", float, defaults.keep_alive_s, _positive),
        head_timeout_s=r.get(
            data, "server", "head_timeout_s", float, defaults.head_timeout_s, _positive
        ),
        body_timeout_s=r.get(
            data, "server", "body_timeout_s", float, defaults.body_timeout_s, _positive
        ),
        send_timeout_s=r.get(
            data, "server", "send_timeout_s", float, defaults.send_timeout_s, _positive
        ),
        max_connections=r.get(
            data, "server", "max_connections", int, defaults.max_connections, _positive
        ),
        reserved_connections=r.get(
            data,
            "server",
            "reserved_connections",
            int,
            defaults.reserved_connections,
            _non_negative,
        ),
    )


def _strings(r: _Reader, data: dict[str, Any], name: str) -> list[str] | None:
    """``server.NAME`` as a list of non-empty strings; None if absent or wrong."""
    if name not in data:
        return None
    value = data[name]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        r.error(f"server.{name}", f"must be a list of non-empty strings, got {_kind(value)}")
        return None
    return [v.strip().lower() for v in value]


def _allowed_hosts(r: _Reader, data: dict[str, Any]) -> tuple[str, ...] | None:
    hosts = _strings(r, data, "allowed_hosts")
    if hosts is None:
        return None
    for host in hosts:
        if host != "*" and any(c in host for c in "/:@ ") and not _is_ip(host.strip("[]")):
            r.error(
                "server.allowed_hosts",
                f"{host!r} is not a host name: give names or addresses without scheme or "
                'port, such as "yard.lan" or "192.168.1.10" (".yard.lan" for subdomains too, '
                '"*" for any)',
            )
    return tuple(host.strip("[]").rstrip(".") for host in hosts)


def _allowed_origins(r: _Reader, data: dict[str, Any]) -> tuple[str, ...]:
    origins = _strings(r, data, "allowed_origins") or []
    for origin in origins:
        scheme, sep, rest = origin.partition("://")
        if scheme not in ("http", "https") or not sep or not rest or any(c in rest for c in "/?#@"):
            r.error(
                "server.allowed_origins",
                f"{origin!r} is not an origin: write scheme://host[:port] with no path, such "
                'as "https://chat.example.lan"',
            )
    return tuple(origins)


def _login_max_bytes(r: _Reader, data: dict[str, Any]) -> int:
    size = r.size(data, "server", "dashboard_login_max_bytes", 4096)
    if size <= 0:
        r.error("server.dashboard_login_max_bytes", "must be greater than 0")
    return size


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _path(r: _Reader, key: str, text: str, data_dir: Path | None) -> Path | None:
    """An absolute path from ``text`` (relative to the config file), with
    ``{config_dir}`` and, when known, ``{data_dir}`` filled in."""
    allowed = PATH_PLACEHOLDERS if data_dir is not None else ("config_dir",)
    problem = _placeholders(text, allowed)
    if problem:
        r.error(key, problem)
        return None
    return _expand(text, r.path.parent, data_dir)


def _expand(text: str, config_dir: Path, data_dir: Path | None) -> Path:
    values = {"config_dir": str(config_dir), "data_dir": str(data_dir)}
    expanded = Path(text.format_map(values)).expanduser()
    return expanded if expanded.is_absolute() else (config_dir / expanded).resolve()


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


def _apps(
    r: _Reader, data: dict[str, Any], server: ServerConfig, scheduler: SchedulerConfig
) -> dict[str, AppConfig]:
    apps: dict[str, AppConfig] = {}
    owner_of_key: dict[bytes, str] = {}
    for name in data:
        key = f"apps.{name}"
        if not _NAME.match(name):
            r.error(key, "app names use letters, digits, '_', '.', '-'")
        table = r.table(data, "apps", name)
        r.known(table, key, APP_KEYS)
        given = [k for k in APP_SECRETS if k in table]
        secret = digest = None
        if len(given) > 1:
            both = f"either {given[0]} or {given[1]}, not both"
            r.error(key, f"give {both if len(given) == 2 else 'one of key, key_env or key_sha256'}")
        elif not given:
            r.error(
                key,
                'needs key = "...", key_env = "VARIABLE" or key_sha256 = "HEX" (apps are told '
                f"apart by key; `yard key new {name}` makes one)",
            )
        elif given == ["key_sha256"]:
            hex_digest = r.get(table, key, "key_sha256", str, "", _sha256_hex)
            digest = bytes.fromhex(hex_digest) if hex_digest else None
        else:
            secret = r.secret(table, key, "key", "key_env")
            digest = key_digest(secret) if secret else None
        limits = _app_limits(r, table, key)
        max_priority = r.get(table, key, "max_priority", float, scheduler.max_priority)
        default_priority = r.get(
            table, key, "default_priority", float, min(server.default_priority, max_priority)
        )
        low, high = scheduler.min_priority, scheduler.max_priority
        for field_name, value in (
            ("max_priority", max_priority),
            ("default_priority", default_priority),
        ):
            if field_name in table and not low <= value <= high:
                r.error(
                    f"{key}.{field_name}",
                    f"{value} is outside the scheduler's range [{low}, {high}]",
                )
        if default_priority > max_priority:
            r.error(
                f"{key}.default_priority",
                f"{default_priority} is above this app's max_priority {max_priority}",
            )
        if digest is None or limits is None:
            continue
        if digest in owner_of_key:
            r.error(
                f"{key}.{given[0]}",
                f"the same key is already used by app {owner_of_key[digest]!r}; "
                "keys tell apps apart, give each its own",
            )
            continue
        owner_of_key[digest] = name
        apps[name] = dataclasses.replace(
            limits,
            name=name,
            key=secret or "",
            key_sha256=None if secret else digest,
            default_priority=default_priority,
            max_priority=max_priority,
        )
    return apps


def _sha256_hex(value: str) -> str | None:
    if _SHA256_HEX.match(value):
        return None
    return (
        f"must be 64 hexadecimal digits (a SHA-256 digest, as `yard key new` prints), "
        f"got {len(value)} characters"
    )


def _app_limits(r: _Reader, table: dict[str, Any], key: str) -> AppConfig | None:
    """An app's ``models``, ``max_concurrent``, ``max_queued`` and ``weight``
    (in an AppConfig with no name or key yet); None if one is wrong."""
    before = len(r.errors)
    models = None
    if "models" in table:
        models = _str_list(r, table, key, "models")
        if not models and isinstance(table["models"], list):
            r.error(f"{key}.models", "is empty: leave it out to let the app use every model")
    counts = {
        name: r.get(table, key, name, int, 0, _positive) if name in table else None
        for name in ("max_concurrent", "max_queued")
    }
    weight = r.get(table, key, "weight", float, 1.0, _positive)
    if len(r.errors) > before:
        return None
    return AppConfig(
        name="",
        default_priority=0.0,
        max_priority=0.0,
        models=models,
        max_concurrent=counts["max_concurrent"],
        max_queued=counts["max_queued"],
        weight=weight,
    )


def _check_app_models(
    r: _Reader, apps: Mapping[str, AppConfig], backends: Mapping[str, BackendConfig]
) -> None:
    """Each ``models`` pattern of an app must match a configured model (or the
    name of a backend that names none): a typo must not hide a model."""
    names = [m for b in backends.values() for m in (b.models or (b.name,))]
    for app in apps.values():
        for i, pattern in enumerate(app.models or ()):
            if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
                r.error(
                    f"apps.{app.name}.models[{i}]",
                    f"{pattern!r} matches no model of any backend "
                    f"(models: {', '.join(names) or 'none'})",
                )


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
        for model in backend.models:
            if model in owner_of_model:
                r.error(
                    f"{key}.models",
                    f"model {model!r} is already served by backend {owner_of_model[model]!r}; "
                    "a model name must lead to one backend",
                )
            else:
                owner_of_model[model] = name
        backends[name] = backend
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

    env: dict[str, str] = {}
    env_table = r.get(table, key, "env", dict, {})
    for var, value in env_table.items():
        if not isinstance(value, str):
            r.error(f"{key}.env.{var}", f"must be a string, got {_kind(value)}")
            continue
        problem = _placeholders(value, PLACEHOLDERS)
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

    slots = r.get(table, key, "slots", int, 1)
    if slots < 1:
        r.error(f"{key}.slots", f"must be at least 1, got {slots}")
        slots = 1
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
        model_file=model_file,
        path_templates={
            key: text for key, text in (("cwd", cwd_text), ("model_file", model_file_text)) if text
        },
        stop_grace_s=r.get(table, key, "stop_grace_s", float, server.stop_grace_s, _non_negative),
        fill_context=fill_context,
    )


def _str_list(r: _Reader, table: Mapping[str, Any], key: str, name: str) -> tuple[str, ...]:
    value = table.get(name, [])
    if not isinstance(value, list):
        r.error(f"{key}.{name}", f"must be a list of strings, got {_kind(value)}")
        return ()
    items = []
    for i, item in enumerate(value):
        if isinstance(item, str) and item:
            items.append(item)
        else:
            r.error(f"{key}.{name}[{i}]", f"must be a non-empty string, got {_kind(item)}")
    return tuple(items)


def _url_path(value: str) -> str | None:
    return None if value.startswith("/") else f"must start with '/', got {value!r}"


def _as_toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


# -- yard check ---------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``yard check CONFIG``."""
    parser.description = (
        "Validate a configuration file without starting anything: print every problem "
        "(file, key, what is wrong) and exit 1, or a short summary and exit 0."
    )
    parser.add_argument("config", type=Path, help="the TOML configuration file")


def run(args: argparse.Namespace) -> int:
    """Print the errors of ``args.config`` (exit 1) or a summary (exit 0)."""
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        count = len(exc.errors)
        print(f"{count} error{'s' if count != 1 else ''}", file=sys.stderr)
        return 1
    for line in warnings(config):
        print(line, file=sys.stderr)
    print(summary(config))
    return 0


def warnings(config: Config) -> list[str]:
    """Problems of a valid file that only show on this machine: a program not
    on PATH, a model file or working directory that does not exist (yet).
    ``yard check`` prints them; they do not make the file invalid."""
    found = []
    if config.server.allow_anonymous and config.apps:
        found.append(
            f"{config.path}: server.allow_anonymous: warning: has no effect while apps have "
            "keys (every data-plane request needs one)"
        )
    for b in config.backends.values():
        key = f"{config.path}: backends.{b.name}"
        program = b.command[0].replace("{python}", sys.executable)
        cwd = b.cwd or config.config_dir
        if "{" not in program:
            if "/" in program:
                target = cwd / program
                if not os.access(target, os.X_OK):
                    found.append(f"{key}.command[0]: warning: {target} is not an executable file")
            elif shutil.which(program) is None:
                found.append(f"{key}.command[0]: warning: {program} is not on PATH")
        if b.model_file is not None and not b.model_file.exists():
            found.append(f"{key}.model_file: warning: {b.model_file} does not exist (yet)")
        if b.cwd is not None and not b.cwd.is_dir():
            found.append(f"{key}.cwd: warning: {b.cwd} is not a directory (yet)")
    return found


def summary(config: Config) -> str:
    """A few lines describing a valid configuration (what ``yard check`` prints)."""
    server = config.server
    models = config.models()
    devices = sorted(
        {HOST, *config.devices, *(gpu for b in config.backends.values() for gpu in b.gpus)}
    )
    lines = [
        f"{config.path}: OK",
        f"  listen:   {server.listen_host}:{server.listen_port}   data_dir: {server.data_dir}",
        f"  backends: {len(config.backends)} ({', '.join(config.backends) or 'none'})",
        f"  models:   {len(models)} ({', '.join(m for m, _ in models) or 'none'})",
        f"  apps:     {len(config.apps)} ({', '.join(config.apps) or 'none'})",
        f"  devices:  {', '.join(devices)}",
        *(f"  access:   {line}" for line in exposure(config)),
    ]
    return "\n".join(lines)
