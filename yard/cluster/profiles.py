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
finds the profile another node measured, and loads without measuring again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import Any

import psycopg
import trio
from psycopg.types.json import Jsonb

from yard.cluster.pg import PgDatabase, Row
from yard.core.spec import Profile
from yard.memory.profiles import (
    ConfigLike,
    FootprintKey,
    ProfileLookups,
    StoredProfile,
    footprint_key,
)

__all__ = ["PgProfileStore", "cluster_key"]

_KEY_VERSION = "cluster/1"

_MEASURED = (
    "gpu_bytes, host_bytes, load_s, steady_gpu_bytes, steady_host_bytes, source, measured_at, "
    "context, gpu_per_token, host_per_token, parallel, gpu_per_slot, host_per_slot"
)
_COLUMNS = "key, backend, parts, " + _MEASURED
# Storing a profile again replaces every column but the key (one list, so a
# new column cannot be inserted and then left stale on replace).
_REPLACE = ", ".join(
    f"{name} = excluded.{name}" for name in ("backend", "parts", *_MEASURED.split(", "), "node")
)


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
        parts=parts if isinstance(parts, dict) else {},
    )


class PgProfileStore(ProfileLookups):
    """The profile store of a cluster node: the interface of
    :class:`yard.memory.profiles.SqliteProfileStore` (and so of
    :class:`yard.ports.ProfileStore`), on the shared database.

    db: opened with :data:`yard.cluster.schema.MIGRATIONS`. config: this
    node's (each backend's command, files and devices). node: this node's
    name, kept with each measurement. devices: labels of this node's GPUs
    (``meter.describe()``). clock: ``measured_at`` (wall-clock seconds).
    Unknown backend names have no profile; storing one raises ``KeyError``.
    """

    def __init__(
        self,
        db: PgDatabase,
        config: ConfigLike,
        *,
        node: str,
        devices: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._db = db
        self._config = config
        self._node = node
        self._devices = dict(devices or {})
        self._clock = clock

    @property
    def db(self) -> PgDatabase:
        return self._db

    def use_config(self, config: ConfigLike) -> None:
        """Read each backend's command from ``config`` from now on (``yard reload``)."""
        self._config = config

    async def key(self, backend: str) -> FootprintKey:
        """The cluster key of ``backend``'s current footprint (``KeyError``
        if unknown). Blocking file checks run in a worker thread."""
        config = self._config.backends[backend]
        local = await trio.to_thread.run_sync(
            lambda: footprint_key(
                config,
                config_dir=self._config.path.parent,
                data_dir=self._config.server.data_dir,
                devices=self._devices,
            )
        )
        return cluster_key(local)

    async def record(self, backend: str) -> StoredProfile | None:
        """The stored profile for the current footprint, with its details."""
        if backend not in self._config.backends:
            return None
        key = await self.key(backend)
        row = await self._db.fetchone(
            f"SELECT {_COLUMNS} FROM profiles WHERE key = %s", (key.digest,)
        )
        return None if row is None else _row(row)

    async def store(
        self,
        backend: str,
        profile: Profile,
        *,
        steady_gpu_bytes: int | None = None,
        steady_host_bytes: int | None = None,
        source: str = "probe",
    ) -> StoredProfile:
        """Store (replace) the profile for the current footprint, for every
        node with the same footprint, and append it to the history."""
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
        measured = (
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
        )
        marks = ", ".join(["%s"] * (len(measured) + 1))

        def write(conn: psycopg.Connection[Row]) -> None:
            conn.execute(
                f"INSERT INTO profiles ({_COLUMNS}, node) VALUES (%s, %s, %s, {marks}) "
                f"ON CONFLICT (key) DO UPDATE SET {_REPLACE}",
                (record.key, backend, Jsonb(dict(key.parts)), *measured, self._node),
            )
            conn.execute(
                f"INSERT INTO profile_history (key, backend, {_MEASURED}, node) "
                f"VALUES (%s, %s, {marks})",
                (record.key, backend, *measured, self._node),
            )

        await self._db.transaction(write)
        return record

    async def forget(self, backend: str) -> None:
        """Drop the current footprint's profile (history stays): every node
        with this footprint measures it again."""
        if backend not in self._config.backends:
            return
        key = await self.key(backend)
        await self._db.execute("DELETE FROM profiles WHERE key = %s", (key.digest,))

    async def history(self, backend: str, limit: int = 50) -> list[StoredProfile]:
        """Every measurement stored for ``backend`` (any footprint, any
        node), newest first."""
        rows = await self._db.fetchall(
            f"SELECT key, backend, NULL, {_MEASURED} FROM profile_history "
            "WHERE backend = %s ORDER BY id DESC LIMIT %s",
            (backend, limit),
        )
        return [_row(row) for row in rows]

    async def aclose(self) -> None:
        await self._db.close()
