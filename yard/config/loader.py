"""The whole configuration (:class:`Config`), ``[scheduler]``, and
:func:`load_config`, which reads every section and checks the rules between them
(who may reach yard, app models, the admin key).
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yard.config import announcements as recurring
from yard.config.announcements import Recurring
from yard.config.apps import LOCAL_APP, AppConfig, _apps, _check_app_models, key_digest
from yard.config.backends import BackendConfig, DeviceConfig, _backends, _devices
from yard.config.cluster import ClusterConfig, _cluster
from yard.config.folder import FolderConfig, model_files, model_name, read_folder
from yard.config.jobs import JobsConfig, _jobs
from yard.config.reading import ConfigError, _Reader, parse_listen
from yard.config.server import ServerConfig, _server
from yard.core.spec import HOST, BackendSpec, DeviceSpec, SchedulerConfig


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
    announcements: tuple[Recurring, ...] = ()
    cluster: ClusterConfig | None = None
    folder: FolderConfig | None = None
    """``[models]``: a folder of GGUF files served without hand-written backends
    (:mod:`yard.config.folder`); its backends are in ``backends`` once
    :meth:`with_folder` put them there."""
    from_folder: frozenset[str] = frozenset()
    """The names of the backends in ``backends`` that the folder gave."""

    @property
    def config_dir(self) -> Path:
        """The directory holding the file; relative paths start here."""
        return self.path.parent

    def backend_for_model(self, model: str) -> BackendConfig | None:
        """The openai-style backend serving ``model``, or None (its first
        instance, where it has several: the core routes among them)."""
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
        """Every (model, backend name), in file order; a backend with several
        instances once, by its first."""
        return [
            (model, b.name)
            for b in self.backends.values()
            if b.instance_of is None
            for model in b.models
        ]

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
                context=b.context,
                parallel=b.parallel,
                instances=b.instances,
                instance_of=b.instance_of,
                instance_load_penalty=b.instance_load_penalty,
                spread_windows=b.spread_windows,
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

    def with_folder(self, backends: Mapping[str, BackendConfig]) -> Config:
        """This configuration with the folder's backends replaced by
        ``backends`` (the hand-written ones first, then the folder's)."""
        kept = {n: b for n, b in self.backends.items() if n not in self.from_folder}
        return dataclasses.replace(
            self, backends={**kept, **backends}, from_folder=frozenset(backends)
        )

    def with_overrides(
        self,
        *,
        listen: str | None = None,
        data_dir: Path | None = None,
        models: Path | None = None,
        aliases: Sequence[str] = (),
    ) -> Config:
        """The same configuration with ``--listen`` / ``--data-dir`` /
        ``--models`` / ``--alias MODEL=NAME`` applied (command-line values; a
        relative path is relative to the current directory). Raises
        :class:`ConfigError` if the result breaks a rule (a non-loopback
        address with no keys, an alias without ``=``, ``--alias`` without a
        folder)."""
        server = self.server
        errors: list[str] = []
        folder = self.folder
        if models is not None:
            where = models.expanduser().resolve()
            folder = (
                FolderConfig(dir=where)
                if folder is None
                else dataclasses.replace(folder, dir=where)
            )
        if aliases:
            if folder is None:
                raise ConfigError(["--alias: names a model of a folder; give --models DIR"])
            more = {k: list(v) for k, v in folder.aliases.items()}
            for text in aliases:
                model, sep, alias = text.partition("=")
                if not sep or not model or not alias:
                    raise ConfigError([f"--alias: expected MODEL=NAME, got {text!r}"])
                more.setdefault(model, []).append(alias)
            folder = dataclasses.replace(folder, aliases={k: tuple(v) for k, v in more.items()})
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
        return dataclasses.replace(self, server=server, backends=backends, folder=folder)


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


TOP_KEYS = (
    "server",
    "scheduler",
    "devices",
    "apps",
    "backends",
    "models",
    "defaults",
    "jobs",
    "announcements",
    "cluster",
)

SCHEDULER_KEYS = tuple(f.name for f in dataclasses.fields(SchedulerConfig))


def default_config(path: Path, *, env: Mapping[str, str] | None = None) -> Config:
    """The configuration of an empty file at ``path`` (every default): what
    ``yard serve --models DIR`` runs with when there is no file."""
    r = _Reader(path, os.environ if env is None else env)
    config = _build(r, {})
    if r.errors:
        raise ConfigError(r.errors)
    return config


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
    folder = read_folder(r, r.table(data, "", "models"), r.table(data, "", "defaults"), server)
    jobs = _jobs(r, r.table(data, "", "jobs"), server)
    # An app may be scoped to a model of the folder: the names of the files
    # there now count (their backends are built when yard starts).
    in_folder = [] if folder is None else [model_name(p) for p in model_files(folder.dir)]
    if folder is not None:
        in_folder += [a for names in folder.aliases.values() for a in names]
    _check_app_models(r, apps, backends, in_folder)
    announcements = _announcements(r, data.get("announcements"), apps, backends)
    cluster = _cluster(r, data.get("cluster"))
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
        announcements=announcements,
        cluster=cluster,
        folder=folder,
    )


def _announcements(
    r: _Reader,
    raw: object,
    apps: Mapping[str, AppConfig],
    backends: Mapping[str, BackendConfig],
) -> tuple[Recurring, ...]:
    """``[[announcements]]``: recurring announcements (yard.config.announcements)."""
    models = [m for b in backends.values() for m in b.models]
    try:
        return recurring.parse(raw, apps=list(apps), models=models)
    except ValueError as exc:
        key, _, message = str(exc).partition(": ")
        r.error(key, message)
        return ()


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


def local_app(config: Config) -> AppConfig:
    """The app of every request when no app keys are configured."""
    return AppConfig(
        name=LOCAL_APP,
        key="",
        default_priority=config.server.default_priority,
        max_priority=config.scheduler.max_priority,
    )
