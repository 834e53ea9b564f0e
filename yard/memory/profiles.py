"""Profiles: what a backend was measured to need, kept in a database.

:class:`Profiles` keeps them in SQLite (``data_dir/profiles.sqlite``) for one
yard, or in a cluster's PostgreSQL, where one measurement serves every node
with the same footprint (the cluster injects a portable key,
:func:`yard.cluster.profiles.cluster_key`).

A profile is valid only for the footprint it was measured with. The key
(:func:`footprint_key`) is a digest of everything that changes it:

- the backend's command and arguments and its environment (as configured,
  placeholders unexpanded: the port changes at every launch, the footprint
  does not);
- the server itself: the executable's resolved path, size and modification
  time (a new build of ``llama-server`` is a new server);
- every file the command names (the model file above all): path, size and
  modification time, so a re-downloaded or re-quantised model is measured
  again;
- the devices: the GPUs it may be placed on, how many it takes, and what
  each GPU is (product and capacity, from the meter).

Changing any part gives a new key, and the backend is measured again; old
rows stay, so going back to an earlier model finds its profile. Every stored
measurement is also appended to a history table.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import trio

from yard.config import programs
from yard.core.spec import Profile
from yard.db import Database, Migration, Row, SqliteDatabase, Tx, insert
from yard.memory.llama import find_llama_server

PROFILE_MIGRATIONS: Sequence[Migration] = (
    (
        "profiles/1 tables",
        """
        CREATE TABLE profiles (
            key TEXT PRIMARY KEY,
            backend TEXT NOT NULL,
            parts TEXT NOT NULL,
            gpu_bytes INTEGER NOT NULL,
            host_bytes INTEGER NOT NULL,
            load_s REAL NOT NULL,
            steady_gpu_bytes INTEGER,
            steady_host_bytes INTEGER,
            source TEXT NOT NULL,
            measured_at REAL NOT NULL
        );
        CREATE TABLE profile_history (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            key TEXT NOT NULL,
            backend TEXT NOT NULL,
            gpu_bytes INTEGER NOT NULL,
            host_bytes INTEGER NOT NULL,
            load_s REAL NOT NULL,
            steady_gpu_bytes INTEGER,
            steady_host_bytes INTEGER,
            source TEXT NOT NULL,
            measured_at REAL NOT NULL
        );
        CREATE INDEX profile_history_by_backend ON profile_history (backend, id);
        """,
    ),
    (
        "profiles/2 context",
        """
        ALTER TABLE profiles ADD COLUMN context INTEGER;
        ALTER TABLE profiles ADD COLUMN gpu_per_token REAL;
        ALTER TABLE profiles ADD COLUMN host_per_token REAL;
        ALTER TABLE profile_history ADD COLUMN context INTEGER;
        ALTER TABLE profile_history ADD COLUMN gpu_per_token REAL;
        ALTER TABLE profile_history ADD COLUMN host_per_token REAL;
        """,
    ),
    (
        "profiles/3 parallel",
        """
        ALTER TABLE profiles ADD COLUMN parallel INTEGER;
        ALTER TABLE profiles ADD COLUMN gpu_per_slot REAL;
        ALTER TABLE profiles ADD COLUMN host_per_slot REAL;
        ALTER TABLE profile_history ADD COLUMN parallel INTEGER;
        ALTER TABLE profile_history ADD COLUMN gpu_per_slot REAL;
        ALTER TABLE profile_history ADD COLUMN host_per_slot REAL;
        """,
    ),
)
"""The profile store's tables (``data_dir/profiles.sqlite``)."""

PROFILES_FILE = "profiles.sqlite"


class BackendLike(Protocol):
    """What the key needs from a backend's configuration
    (:class:`yard.config.BackendConfig` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def command(self) -> tuple[str, ...]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def cwd(self) -> Path | None: ...
    @property
    def gpus(self) -> tuple[str, ...]: ...
    @property
    def gpu_count(self) -> int: ...
    @property
    def model_file(self) -> Path | None: ...


class ServerLike(Protocol):
    @property
    def data_dir(self) -> Path: ...


class ConfigLike(Protocol):
    """What the store needs from :class:`yard.config.Config`."""

    @property
    def path(self) -> Path: ...
    @property
    def server(self) -> ServerLike: ...
    @property
    def backends(self) -> Mapping[str, BackendLike]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class FootprintKey:
    """digest: the key. parts: what went into it (JSON-able), for people who
    wonder why a backend is being measured again."""

    digest: str
    parts: Mapping[str, object]


def _identity(path: Path) -> dict[str, object] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def fill_known(arg: str, values: Mapping[str, str]) -> str:
    """``arg`` with the placeholders of ``values`` filled in, before a launch
    (for the profile key and the prior from the model file)."""
    # Only the placeholders that name files matter here; others stay as
    # written (str.format would choke on the {port} we don't have).
    for name, value in values.items():
        arg = arg.replace("{" + name + "}", value)
    return arg


def _wrapped_server(argv: Sequence[str]) -> dict[str, object] | None:
    """The real server behind a launcher module: ``{python} -m
    yard.demo.llama_server`` execs llama-server, whose build is the version
    that matters, not the interpreter's."""
    if "yard.demo.llama_server" not in argv and "yard.demo.xllama_server" not in argv:
        return None
    binary = find_llama_server()
    return None if binary is None else _identity(binary.resolve())


def footprint_key(
    backend: BackendLike,
    *,
    config_dir: Path,
    data_dir: Path,
    devices: Mapping[str, str] | None = None,
) -> FootprintKey:
    """The key of a backend's current footprint (blocking: it stats files).

    devices: a label per device (``"gpu0": "NVIDIA H200 150...bytes"``), from
    the meter's ``describe()``; GPUs without a label are keyed by name only.
    """
    values = {
        "config_dir": str(config_dir),
        "data_dir": str(data_dir),
        "python": sys.executable,
    }
    if backend.model_file is not None:
        values["model_file"] = str(backend.model_file)
    base = backend.cwd or config_dir
    try:
        # {llama_server}: the server this machine runs (yard.config.programs).
        command = programs.expand(backend.command)
    except programs.ProgramNotFound:
        command = list(backend.command)
    argv = [fill_known(arg, values) for arg in command]
    search_path = backend.env.get("PATH", os.environ.get("PATH", ""))
    exe_name = argv[0] if argv else ""
    exe = shutil.which(exe_name, path=search_path) if exe_name else None
    if exe is None and exe_name and (base / exe_name).is_file():
        exe = str(base / exe_name)
    executable = _identity(Path(exe).resolve()) if exe else None

    files: dict[str, object] = {}
    candidates = [str(backend.model_file)] if backend.model_file is not None else []
    for arg in argv[1:]:
        candidates.append(arg)
        if arg.startswith("-") and "=" in arg:
            candidates.append(arg.split("=", 1)[1])
    for candidate in candidates:
        if not candidate or candidate.startswith("-"):
            continue
        path = Path(candidate).expanduser()
        path = path if path.is_absolute() else base / path
        if path.is_file():
            identity = _identity(path.resolve())
            if identity is not None and identity != executable:
                files[str(path.resolve())] = identity
    labels = devices or {}
    parts: dict[str, object] = {
        "command": list(backend.command),
        # Values may be secrets (tokens): the key needs them, the table not.
        "env": sorted(
            [name, hashlib.sha256(value.encode()).hexdigest()[:16]]
            for name, value in backend.env.items()
        ),
        "executable": executable or exe_name,
        "server": _wrapped_server(argv),
        "files": files,
        "gpus": [[gpu, labels.get(gpu, "")] for gpu in backend.gpus],
        "gpu_count": backend.gpu_count if backend.gpus else 0,
    }
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return FootprintKey(digest=hashlib.sha256(canonical.encode()).hexdigest(), parts=parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredProfile:
    """One stored measurement, with what the engine's :class:`Profile` lacks.

    steady_*: memory once warmed up and idle (None: not measured, e.g. a
        profile the engine raised). measured_at: wall-clock seconds (Unix).
    source: ``"measured"`` (engine, first load), ``"raised"`` (engine, live use
        above the profile), ``"probe"`` (``yard probe``).
    """

    backend: str
    key: str
    profile: Profile
    steady_gpu_bytes: int | None = None
    steady_host_bytes: int | None = None
    source: str = "measured"
    measured_at: float = 0.0
    parts: Mapping[str, object] = field(default_factory=dict)


_MEASURED = (
    "gpu_bytes, host_bytes, load_s, steady_gpu_bytes, steady_host_bytes, source, measured_at, "
    "context, gpu_per_token, host_per_token, parallel, gpu_per_slot, host_per_slot"
)
_COLUMNS = "key, backend, parts, " + _MEASURED


def _row(row: Row) -> StoredProfile:
    key, backend, parts, gpu, host, load_s, steady_gpu, steady_host, source, at = row[:10]
    context, gpu_per_token, host_per_token, parallel, gpu_per_slot, host_per_slot = row[10:]
    return StoredProfile(
        backend=str(backend),
        key=str(key),
        profile=Profile(
            gpu_bytes=int(gpu),
            host_bytes=int(host),
            load_s=float(load_s),
            context=None if context is None else int(context),
            gpu_per_token=None if gpu_per_token is None else float(gpu_per_token),
            host_per_token=None if host_per_token is None else float(host_per_token),
            parallel=None if parallel is None else int(parallel),
            gpu_per_slot=None if gpu_per_slot is None else float(gpu_per_slot),
            host_per_slot=None if host_per_slot is None else float(host_per_slot),
        ),
        steady_gpu_bytes=None if steady_gpu is None else int(steady_gpu),
        steady_host_bytes=None if steady_host is None else int(steady_host),
        source=str(source),
        measured_at=float(at),
        # JSON text (SQLite) or already decoded (PostgreSQL's jsonb).
        parts=parts if isinstance(parts, dict) else json.loads(parts) if parts else {},
    )


class Profiles:
    """The profile store behind :class:`yard.ports.ProfileStore`, over either
    database.

    db: opened with :data:`PROFILE_MIGRATIONS` (SQLite; or use
    :func:`open_profile_store`) or a cluster's migrations. config: each
    backend's command, files and devices. devices: labels of the GPUs
    (``meter.describe()``). clock: ``measured_at`` (wall-clock seconds).
    portable: turns this machine's key into the one stored (a cluster's
    :func:`~yard.cluster.profiles.cluster_key`); None: this machine's.
    node: a cluster node's name, kept with each measurement.
    Unknown backend names have no profile; storing one raises ``KeyError``.
    """

    def __init__(
        self,
        db: Database,
        config: ConfigLike,
        *,
        devices: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        portable: Callable[[FootprintKey], FootprintKey] | None = None,
        node: str | None = None,
    ) -> None:
        self._db = db
        self._config = config
        self._devices = dict(devices or {})
        self._clock = clock
        self._portable = portable
        self._also: dict[str, object] = {} if node is None else {"node": node}

    @property
    def db(self) -> Database:
        return self._db

    def use_config(self, config: ConfigLike) -> None:
        """Read each backend's command from ``config`` from now on (``yard
        reload``: backends added, changed or removed)."""
        self._config = config

    async def key(self, backend: str) -> FootprintKey:
        """The current footprint key of ``backend`` (``KeyError`` if unknown).
        Blocking file checks run in a worker thread."""
        config = self._config.backends[backend]
        local = await trio.to_thread.run_sync(
            lambda: footprint_key(
                config,
                config_dir=self._config.path.parent,
                data_dir=self._config.server.data_dir,
                devices=self._devices,
            )
        )
        return local if self._portable is None else self._portable(local)

    async def record(self, backend: str) -> StoredProfile | None:
        """The stored profile for the current footprint, with its details."""
        if backend not in self._config.backends:
            return None
        key = await self.key(backend)
        row = await self._db.fetchone(
            f"SELECT {_COLUMNS} FROM profiles WHERE key = ?", (key.digest,)
        )
        return None if row is None else _row(row)

    async def get(self, backend: str) -> Profile | None:
        record = await self.record(backend)
        return None if record is None else record.profile

    async def put(self, backend: str, profile: Profile) -> None:
        """Store what the engine measured (first load) or raised (live use
        above the profile). A steady state measured before is kept."""
        previous = await self.record(backend)
        await self.store(
            backend,
            profile,
            steady_gpu_bytes=None if previous is None else previous.steady_gpu_bytes,
            steady_host_bytes=None if previous is None else previous.steady_host_bytes,
            source="measured" if previous is None else "raised",
        )

    async def store(
        self,
        backend: str,
        profile: Profile,
        *,
        steady_gpu_bytes: int | None = None,
        steady_host_bytes: int | None = None,
        source: str = "probe",
    ) -> StoredProfile:
        """Store (replace) the profile for the current footprint, with its
        steady state (for every node with the same footprint, in a cluster),
        and append it to the history."""
        key = await self.key(backend)
        record = StoredProfile(
            backend=backend,
            key=key.digest,
            profile=profile,
            steady_gpu_bytes=steady_gpu_bytes,
            steady_host_bytes=steady_host_bytes,
            source=source,
            measured_at=self._clock(),
            parts=key.parts,
        )
        measured = dict(
            zip(
                _MEASURED.split(", "),
                (
                    profile.gpu_bytes,
                    profile.host_bytes,
                    profile.load_s,
                    steady_gpu_bytes,
                    steady_host_bytes,
                    source,
                    record.measured_at,
                    profile.context,
                    profile.gpu_per_token,
                    profile.host_per_token,
                    profile.parallel,
                    profile.gpu_per_slot,
                    profile.host_per_slot,
                ),
                strict=True,
            )
        )
        parts = json.dumps(key.parts, sort_keys=True)
        row = {"key": record.key, "backend": backend, "parts": parts, **measured, **self._also}
        # Storing again replaces every column but the key.
        replace = ", ".join(f"{name} = excluded.{name}" for name in row if name != "key")

        def write(tx: Tx) -> None:
            insert(tx, "profiles", row, conflict=f"(key) DO UPDATE SET {replace}")
            insert(tx, "profile_history", {k: v for k, v in row.items() if k != "parts"})

        await self._db.transaction(write)
        return record

    async def forget(self, backend: str) -> None:
        """Drop the current footprint's profile (history stays): it is
        measured again (on every node with this footprint, in a cluster)."""
        if backend not in self._config.backends:
            return
        key = await self.key(backend)
        await self._db.execute("DELETE FROM profiles WHERE key = ?", (key.digest,))

    async def history(self, backend: str, limit: int = 50) -> list[StoredProfile]:
        """Every measurement stored for ``backend`` (any footprint, any
        node), newest first."""
        rows = await self._db.fetchall(
            f"SELECT key, backend, NULL, {_MEASURED} FROM profile_history "
            "WHERE backend = ? ORDER BY id DESC LIMIT ?",
            (backend, limit),
        )
        return [_row(row) for row in rows]

    async def aclose(self) -> None:
        await self._db.close()


async def open_profile_store(
    config: ConfigLike, *, devices: Mapping[str, str] | None = None
) -> Profiles:
    """Open (creating if needed) ``data_dir/profiles.sqlite`` as a store.
    Close it with :meth:`Profiles.aclose`."""
    path = config.server.data_dir / PROFILES_FILE
    await trio.Path(path.parent).mkdir(parents=True, exist_ok=True)
    db = await SqliteDatabase.open(path, PROFILE_MIGRATIONS)
    return Profiles(db, config, devices=devices)


class MemoryProfileStore:
    """A :class:`yard.ports.ProfileStore` in a dict, for tests and the simulator."""

    def __init__(self, profiles: Mapping[str, Profile] | None = None) -> None:
        self.profiles: dict[str, Profile] = dict(profiles or {})
        self.puts: list[tuple[str, Profile]] = []

    async def get(self, backend: str) -> Profile | None:
        return self.profiles.get(backend)

    async def put(self, backend: str, profile: Profile) -> None:
        self.profiles[backend] = profile
        self.puts.append((backend, profile))

    async def forget(self, backend: str) -> None:
        self.profiles.pop(backend, None)
