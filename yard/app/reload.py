"""Change the configuration without a restart: ``yard reload``, SIGHUP, and
the models folder's rescans.

Rules this module keeps:

- The new file is validated completely first (as ``yard serve`` would); an
  invalid one changes nothing: yard keeps serving the configuration it runs,
  logs every error, and ``yard reload`` prints them and exits 1.
- Backends: new ones appear (:class:`~yard.core.events.BackendsChanged`),
  removed ones drain and stop, changed ones restart once idle
  (:mod:`yard.core.catalog`). A model being served is never stopped by a
  reload or a rescan.
- App keys, app scopes and the model names apps see change at once (the
  HTTP side reads the configuration the reload publishes).
- What needs a restart keeps its running value, with a warning:
  ``server.listen``, ``server.data_dir``, ``[cluster]``, ``[devices]``,
  ``[scheduler]``, ``[jobs]`` and the apps' queue limits and weights.
- One reload at a time; the folder's rescan (``[models] rescan_s``) is a
  reload of the folder alone.
- The outcome is written to ``DATA_DIR/reload.json`` for ``yard reload``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from yard import modelfolder
from yard.config import Config, ConfigError
from yard.core.events import BackendsChanged
from yard.engine import Engine
from yard.memory.prior import with_priors
from yard.memory.profiles import Profiles
from yard.supervisor import Supervisor

__all__ = ["OUTCOME_FILE", "Outcome", "Reloader"]

log = logging.getLogger("yard.reload")

OUTCOME_FILE = "reload.json"
"""Where the last reload's outcome is written, in the data directory."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What a reload did. ok: the new configuration runs (False: the old one
    still does, for ``errors``)."""

    ok: bool
    at: float
    why: str
    errors: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for the log and ``yard reload``."""
        if not self.ok:
            return f"{len(self.errors)} error(s); still serving the previous configuration"
        parts = [
            f"{label}: {', '.join(names)}"
            for label, names in (
                ("added", self.added),
                ("removed (drain, then stop)", self.removed),
                ("changed (restart once idle)", self.changed),
            )
            if names
        ]
        return "; ".join(parts) or "no backend changed"


@dataclass(eq=False, kw_only=True)
class Reloader:
    """Applies new configurations to a running yard.

    load: reads the file again with the command line's overrides (raises
        ConfigError).
    base: the configuration as read, before the folder's backends.
    current: the configuration running now (with them).
    gpus: the devices the meter sees (the folder's backends may use them).
    publish: hands the HTTP side the new configuration.
    """

    load: Callable[[], Config]
    base: Config
    current: Config
    gpus: Sequence[str]
    engine: Engine
    supervisor: Supervisor
    profiles: Profiles
    publish: Callable[[Config], None]
    _lock: trio.Lock = field(default_factory=trio.Lock)

    async def reload(self, why: str) -> Outcome:
        """Read the file again and apply it (or keep the old one, logging why)."""
        async with self._lock:
            try:
                new = await trio.to_thread.run_sync(self.load)
            except ConfigError as exc:
                outcome = Outcome(ok=False, at=time.time(), why=why, errors=tuple(exc.errors))
                log.error("reload (%s): %s", why, outcome.summary())
                for line in exc.errors:
                    log.error("reload: %s", line)
                await self._record(outcome)
                return outcome
            return await self._apply(new, why)

    async def rescan(self) -> Outcome:
        """Look at the models folder again (the file is not read again)."""
        async with self._lock:
            return await self._apply(self.base, "models folder rescan", quiet=True)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Rescan the models folder every ``[models] rescan_s`` (0: never)."""
        task_status.started()
        while True:
            folder = self.current.folder
            period = folder.rescan_s if folder is not None else 0.0
            await trio.sleep(period if period > 0 else 5.0)
            if period > 0:
                await self.rescan()

    async def _apply(self, loaded: Config, why: str, *, quiet: bool = False) -> Outcome:
        old = self.current
        kept, warnings = _keep_restart_only(old, loaded)
        new, notes = await trio.to_thread.run_sync(modelfolder.scan, kept, tuple(self.gpus))
        added = tuple(n for n in new.backends if n not in old.backends)
        removed = tuple(n for n in old.backends if n not in new.backends)
        changed = tuple(
            n for n in new.backends if n in old.backends and new.backends[n] != old.backends[n]
        )
        if added or changed:
            wanted = set(added) | set(changed)
            specs = [s for s in new.backend_specs() if s.name in wanted]
            specs = await trio.to_thread.run_sync(with_priors, new, specs)
        else:
            specs = []
        by_name = {s.name: s for s in specs}
        # Everything that looks a backend up by name sees the new file first;
        # then the core learns of the change.
        self.supervisor.config = new
        self.profiles.use_config(new)
        self.publish(new)
        self.base = kept
        self.current = new
        if added or removed or changed:
            self.engine.send(
                BackendsChanged(
                    added=tuple(by_name[n] for n in added),
                    removed=removed,
                    replaced=tuple(by_name[n] for n in changed),
                )
            )
            # An added backend measured in an earlier run (the same footprint)
            # keeps its profile; a changed one is measured anew.
            await self.engine.load_stored_profiles(added)
        outcome = Outcome(
            ok=True,
            at=time.time(),
            why=why,
            added=added,
            removed=removed,
            changed=changed,
            notes=tuple(warnings + notes),
        )
        if not quiet or added or removed or changed:
            log.info("reload (%s): %s", why, outcome.summary())
        for line in warnings:
            log.warning("reload: %s", line)
        if not quiet:
            for line in notes:
                log.warning("models: %s", line)
        await self._record(outcome)
        return outcome

    async def _record(self, outcome: Outcome) -> None:
        path = self.current.server.data_dir / OUTCOME_FILE
        text = json.dumps(dataclasses.asdict(outcome), indent=1)
        await trio.to_thread.run_sync(_write, path, text)


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _keep_restart_only(old: Config, new: Config) -> tuple[Config, list[str]]:
    """``new`` with what takes a restart kept as ``old`` has it, and a
    warning for each such part that changed."""
    warnings = []
    server = new.server
    for name, key in (
        ("listen_host", "listen"),
        ("listen_port", "listen"),
        ("data_dir", "data_dir"),
    ):
        if getattr(server, name) != getattr(old.server, name):
            warnings.append(f"server.{key}: changed; it takes a restart of yard")
            server = dataclasses.replace(server, **{name: getattr(old.server, name)})
    kept = dataclasses.replace(new, server=server)
    for section in ("cluster", "devices", "scheduler", "jobs"):
        if getattr(new, section) != getattr(old, section):
            warnings.append(f"[{section}]: changed; it takes a restart of yard")
            kept = dataclasses.replace(kept, **{section: getattr(old, section)})
    # The engine and the core hold these per app from the start.
    unset = {"max_queued": None, "max_concurrent": None, "weight": 1.0}
    for name, app in new.apps.items():
        before = old.apps.get(name)
        for key, default in unset.items():
            if getattr(app, key) != (getattr(before, key) if before else default):
                warnings.append(
                    f"apps.{name}.{key}: changed; the new value takes a restart of yard "
                    "(the key and the models apply now)"
                )
    return kept, sorted(set(warnings))
