"""``[apps.NAME]``: client applications, their keys, scopes and limits
(:class:`AppConfig`), and their reader.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from yard.config.backends import BackendConfig
from yard.config.reading import _NAME, _positive, _Reader, _str_list
from yard.config.server import ServerConfig
from yard.core.spec import SchedulerConfig

LOCAL_APP = "local"
"""The app of every request when no app keys are configured."""


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
    weight: its share of GPU time relative to other apps at about the same
        effective priority (1 for each app that sets none): a request of an
        app ahead of its share ranks up to ``[scheduler] share_points`` lower
        (:mod:`yard.core.fairness`). No app with a weight other than 1: off.
    """

    name: str
    key: str = ""
    key_sha256: bytes | None = None
    default_priority: float
    max_priority: float
    models: tuple[str, ...] | None = None
    max_concurrent: int | None = None
    max_queued: int | None = None
    max_announcements: int | None = None
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

    def may_use_all(self, backend: BackendConfig) -> bool:
        """Whether the app may use every model ``backend`` serves, so that a
        request at ``/backends/NAME/...`` needs no look at the model it names."""
        if self._scope is None:
            return True
        return all(map(self.may_use, backend.models or (backend.name,)))

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
    "max_announcements",
)

APP_SECRETS = ("key", "key_env", "key_sha256")

_SHA256_HEX = re.compile(r"^[0-9a-fA-F]{64}$")


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
    announcements = (
        r.get(table, key, "max_announcements", int, 0, _not_negative)
        if "max_announcements" in table
        else None
    )
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
        max_announcements=announcements,
    )


def _not_negative(value: int) -> str | None:
    return None if value >= 0 else f"must be 0 or more, got {value}"


def _check_app_models(
    r: _Reader,
    apps: Mapping[str, AppConfig],
    backends: Mapping[str, BackendConfig],
    more: Sequence[str] = (),
) -> None:
    """Each ``models`` pattern of an app must match a configured model (or the
    name of a backend that names none, or one of ``more``: the models of the
    folder): a typo must not hide a model."""
    names = [m for b in backends.values() for m in (b.models or (b.name,))] + list(more)
    for app in apps.values():
        for i, pattern in enumerate(app.models or ()):
            if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
                r.error(
                    f"apps.{app.name}.models[{i}]",
                    f"{pattern!r} matches no model of any backend "
                    f"(models: {', '.join(names) or 'none'})",
                )
