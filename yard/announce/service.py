"""The announcement service: validates what apps announce, stores it, tells the core.

An app says "I will send ``count`` requests for ``model`` between ``not_before``
and ``start_by``" (``POST /v1/announcements``); yard loads the model ahead and
keeps it for the window (:mod:`yard.core.windows`). Rules it keeps:

- The app's ``models`` scope applies (a model outside it does not exist for it),
  its priority is clamped to its ``max_priority``, and it may have at most
  ``max_announcements`` open at once (``[scheduler]``, or ``[apps.NAME]``).
- Every announcement is written to the jobs database (synced) before the core
  hears of it, and told to the core again after a restart; it ends exactly once
  (``used``, ``expired`` at its window's end, ``withdrawn``), which the store
  and ``yard_announcements_total{app,outcome}`` record.
- The core's word on an end is read at once: the end is seen in the engine's
  loop, at the moment the core decides it, and what the API and ``/metrics``
  answer includes it from then on, while its synced write to the store follows
  (a client that sent the announced requests and then asks sees them counted,
  however slow the disk).
- An ended announcement is listed as long as a finished job is (``[jobs]
  result_ttl_s + record_ttl_s``), and an app keeps at most its newest
  :data:`KEEP_ENDED_PER_APP` ended ones; older ones are deleted every ``[jobs]
  reap_interval_s``, so making and withdrawing in a loop cannot fill the disk.
- Recurring announcements from the configuration (``[[announcements]]``) are
  made by the same path, one window ahead: the next window of each is always
  announced (:mod:`yard.config.announcements`).

Times are epochs (wall clock) here and in the store; the core gets engine-clock
times, converted at the moment they are sent.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import trio

from yard.announce.store import AnnouncementRecord, AnnouncementStore
from yard.config.announcements import Recurring, next_window, window_after
from yard.core import (
    AnnouncementEnded,
    AnnouncementMade,
    AnnouncementWithdrawn,
    Decision,
    Event,
)
from yard.errors import Rejected
from yard.times import rfc3339_epoch, wall_label

if TYPE_CHECKING:
    from yard.config import AppConfig, Config
    from yard.engine import Engine
    from yard.jobs.store import JobStore

log = logging.getLogger("yard.announce")

MAX_COUNT = 10_000
"""The most requests one announcement may announce."""

KEEP_ENDED_PER_APP = 1000
"""The most ended announcements one app keeps listed (the newest)."""

MAX_WINDOW_S = 24 * 3600.0
"""The longest window an announcement may hold a model for (docs/wait-bound.md)."""


class BadAnnouncement(Rejected):
    """An announcement that cannot be accepted: an HTTP status, a stable code, a
    message that says what to do, and the field at fault (``param``, the
    fourth argument)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(status, code, message, param=param)


class AnnouncementNotFound(Exception):
    """No such announcement for this app."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """How many open announcements an app may have: ``default`` (``[scheduler]
    max_announcements``), or its own (``[apps.NAME] max_announcements``)."""

    default: int = 16
    per_app: Mapping[str, int] | None = None

    def of(self, app: str) -> int:
        if self.per_app is not None and app in self.per_app:
            return self.per_app[app]
        return self.default


class Announcements:
    """Announcements: the API's side (:meth:`create`, :meth:`get`,
    :meth:`listed`, :meth:`withdraw`) and the task that restores them, follows
    their ends and makes the recurring ones (:meth:`run`)."""

    def __init__(
        self,
        *,
        engine: Engine,
        store: AnnouncementStore,
        config: Config,
        limits: Limits,
        recurring: Sequence[Recurring] = (),
        wall: Callable[[], float] = time.time,
        keep_ended_per_app: int = KEEP_ENDED_PER_APP,
    ) -> None:
        self.engine = engine
        self.store = store
        self.config = config
        self.limits = limits
        self.recurring = tuple(recurring)
        self._wall = wall
        self._keep_ended_per_app = keep_ended_per_app
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = trio.Lock()  # the cap's count and the insert go together
        # Ends the core decided that the store does not hold yet: id -> (end, wall time).
        self._unstored: dict[str, tuple[AnnouncementEnded, float]] = {}
        self._wake = trio.Event()

    # -- the API's side -------------------------------------------------------

    async def create(self, app: AppConfig, body: object) -> AnnouncementRecord:
        """Validate ``body`` (the JSON of ``POST /v1/announcements``) for
        ``app``, store it and tell the core. Raises :class:`BadAnnouncement`."""
        now = self._wall()
        fields = _parse(body, now, app.default_priority)
        model = fields.model
        backend = self.config.backend_for_model(model)
        if backend is None or not app.may_use(model):
            raise BadAnnouncement(
                404,
                "model_not_found",
                f"the model {model!r} does not exist in this yard; GET /v1/models lists them",
                "model",
            )
        low = self.config.scheduler.min_priority
        record = AnnouncementRecord(
            seq=0,
            id=f"ann_{uuid.uuid4().hex}",
            app=app.name,
            model=model,
            backend=backend.name,
            not_before=fields.not_before,
            start_by=fields.start_by,
            count=fields.count,
            used=0,
            priority=max(low, min(fields.priority, app.max_priority)),
            status="open",
            source="api",
            created_at=now,
            ended_at=None,
        )
        limit = self.limits.of(app.name)
        if not await self.store.insert(record, max_open=limit):
            raise BadAnnouncement(
                429,
                "too_many_announcements",
                f"app {app.name!r} already has {limit} open announcements, the most "
                "max_announcements allows; withdraw one (DELETE /v1/announcements/ID) or "
                "wait until one ends",
            )
        stored = await self.store.get(record.id)
        assert stored is not None
        self._tell(stored)
        return stored

    async def get(self, announcement_id: str, *, app: str | None) -> AnnouncementRecord:
        """The announcement, if it exists and is ``app``'s (None: any app's)."""
        if not announcement_id.isascii():
            raise AnnouncementNotFound(announcement_id)
        # Taken before the read: an end written (and forgotten here) while the
        # read runs would otherwise be in neither.
        unstored = dict(self._unstored)
        record = await self.store.get(announcement_id)
        if record is None or (app is not None and record.app != app):
            raise AnnouncementNotFound(announcement_id)
        return _current(record, unstored)

    async def listed(self, *, app: str | None, limit: int = 100) -> list[AnnouncementRecord]:
        """The app's announcements (None: every app's), newest first."""
        unstored = dict(self._unstored)
        return [_current(r, unstored) for r in await self.store.listed(app=app, limit=limit)]

    async def withdraw(self, announcement_id: str, *, app: str | None) -> AnnouncementRecord:
        """Withdraw an open announcement (an ended one is returned as it is)."""
        record = await self.get(announcement_id, app=app)
        if record.status == "open":
            # The core's AnnouncementEnded tells how many came (and counts it);
            # the store is marked here too, so that the answer says withdrawn at once.
            self.engine.send(AnnouncementWithdrawn(announcement_id=record.id))
            await self.store.end(record.id, "withdrawn", record.used, self._wall())
            record = await self.get(announcement_id, app=app)
        return record

    def counts(self) -> dict[tuple[str, str], int]:
        """Announcements ended since start, per (app, outcome), for ``/metrics``."""
        return dict(self._counts)

    def describe(self, record: AnnouncementRecord) -> dict[str, object]:
        """The JSON the API answers with."""
        return {
            "id": record.id,
            "object": "announcement",
            "app": record.app,
            "model": record.model,
            "not_before": _rfc3339(record.not_before),
            "start_by": _rfc3339(record.start_by),
            "count": record.count,
            "used": record.used,
            "priority": record.priority,
            "status": record.status,
            "source": record.source,
            "created_at": _rfc3339(record.created_at),
            "ended_at": None if record.ended_at is None else _rfc3339(record.ended_at),
        }

    # -- the task -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the core's ends, tell it the open announcements of the last
        run, then make the recurring ones as their windows come (until cancelled)."""
        async with trio.open_nursery() as nursery:
            self.engine.watch(self._see)
            nursery.start_soon(self._store_ends)
            for record in await self.store.open():
                self._tell(record)
            task_status.started()
            nursery.start_soon(self._purge_forever)
            for entry in self.recurring:
                nursery.start_soon(self._recur, entry)

    async def purge(self) -> int:
        """Delete the ended announcements past their retention; how many went."""
        jobs = self.config.jobs
        keep_s = jobs.result_ttl_s + jobs.record_ttl_s
        return await self.store.purge(
            ended_before=self._wall() - keep_s, keep_per_app=self._keep_ended_per_app
        )

    async def _purge_forever(self) -> None:
        while True:
            gone = await self.purge()
            if gone:
                log.info("announcements: deleted %d ended ones past their retention", gone)
            await trio.sleep(self.config.jobs.reap_interval_s)

    def _see(self, at: float, item: Event | Decision) -> None:
        """The engine's watcher: an end, at the moment the core decides it (the
        core ends each announcement once, so it is counted here, once)."""
        if isinstance(item, AnnouncementEnded):
            self._unstored[item.announcement_id] = (item, self._wall())
            key = (item.app, item.outcome)
            self._counts[key] = self._counts.get(key, 0) + 1
            self._wake.set()

    async def _store_ends(self) -> None:
        """Write the ends the core decided to the store, oldest first."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._unstored:
                aid, (end, at) = next(iter(self._unstored.items()))
                await self._store_end(end, at)
                if self._unstored.get(aid, (None, 0.0))[0] is end:
                    del self._unstored[aid]

    async def _store_end(self, end: AnnouncementEnded, at: float) -> None:
        aid = end.announcement_id
        if not await self.store.end(aid, end.outcome, end.used, at) and end.outcome == "withdrawn":
            # Marked withdrawn by the API first; the core now says how many came.
            await self.store.set_used(aid, end.used)

    async def _recur(self, entry: Recurring) -> None:
        """Keep ``entry``'s next window announced: the window open now (or the
        next one), and each following one as the one before it opens."""
        opens, closes = next_window(entry, self._wall())
        while True:
            await self._announce_recurring(entry, opens, closes)
            await trio.sleep(max(0.0, opens - self._wall()))
            opens, closes = window_after(entry, opens)

    async def _announce_recurring(self, entry: Recurring, opens: float, closes: float) -> None:
        backend = self.config.backend_for_model(entry.model)
        if backend is None:
            return
        app = self.config.apps.get(entry.app)
        top = app.max_priority if app is not None else self.config.scheduler.max_priority
        record = AnnouncementRecord(
            seq=0,
            # One id per entry and window: made once, even across restarts.
            id=f"cfg_{entry.key}_{int(opens)}",
            app=entry.app,
            model=entry.model,
            backend=backend.name,
            not_before=opens,
            start_by=closes,
            count=entry.count,
            used=0,
            priority=min(entry.priority, top),
            status="open",
            source="config",
            created_at=self._wall(),
            ended_at=None,
        )
        if await self.store.get(record.id) is not None:
            return  # made before a restart: already told to the core on start
        await self.store.insert(record)
        stored = await self.store.get(record.id)
        if stored is not None:
            self._tell(stored)

    def _tell(self, record: AnnouncementRecord) -> None:
        """Send the core an open announcement, on its clock."""
        now_engine = self.engine.now()
        now_wall = self._wall()
        self.engine.send(
            AnnouncementMade(
                announcement_id=record.id,
                app=record.app,
                backend=record.backend,
                not_before=now_engine + (record.not_before - now_wall),
                start_by=now_engine + (record.start_by - now_wall),
                count=record.count,
                priority=record.priority,
                used=record.used,
                label=_label(record.not_before, now_wall),
            )
        )


def _current(
    record: AnnouncementRecord, unstored: Mapping[str, tuple[AnnouncementEnded, float]]
) -> AnnouncementRecord:
    """``record`` with the end the core decided and the store did not hold yet."""
    pending = unstored.get(record.id)
    if pending is None or record.status != "open":
        return record
    end, at = pending
    return replace(record, status=end.outcome, used=end.used, ended_at=at)


def announcement_service(engine: Engine, jobs: JobStore, config: Config) -> Announcements:
    """The service ``yard serve`` runs: over the jobs database, with the
    configuration's limits and recurring announcements."""
    per_app = {
        name: app.max_announcements
        for name, app in config.apps.items()
        if app.max_announcements is not None
    }
    return Announcements(
        engine=engine,
        store=AnnouncementStore(jobs.database),
        config=config,
        limits=Limits(default=config.scheduler.max_announcements, per_app=per_app),
        recurring=config.announcements,
    )


# -- the body -------------------------------------------------------------------

_FIELDS = frozenset(
    {"model", "not_before", "start_after", "start_by", "window_s", "count", "priority"}
)


@dataclass(frozen=True, slots=True)
class _Fields:
    model: str
    not_before: float
    start_by: float
    count: int
    priority: float


def _parse(body: object, now: float, default_priority: float) -> _Fields:
    if not isinstance(body, dict):
        raise BadAnnouncement(400, "invalid_request", "the body must be a JSON object")
    unknown = sorted(str(k) for k in body if k not in _FIELDS)
    if unknown:
        raise BadAnnouncement(
            400,
            "unknown_parameter",
            f"unknown field {unknown[0]!r}; an announcement has model, not_before or "
            "start_after, start_by or window_s, count and priority",
            unknown[0],
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadAnnouncement(400, "invalid_request", "model is required: a model's name", "model")
    if "not_before" in body and "start_after" in body:
        raise BadAnnouncement(
            400, "invalid_window", "send either not_before or start_after, not both", "not_before"
        )
    if "start_by" in body and "window_s" in body:
        raise BadAnnouncement(
            400, "invalid_window", "send either start_by or window_s, not both", "start_by"
        )
    if "not_before" in body:
        opens = _time(body["not_before"], "not_before")
    elif "start_after" in body:
        opens = now + _seconds(body["start_after"], "start_after", zero=True)
    else:
        opens = now
    if "start_by" in body:
        closes = _time(body["start_by"], "start_by")
    elif "window_s" in body:
        closes = opens + _seconds(body["window_s"], "window_s", zero=False)
    else:
        raise BadAnnouncement(
            400,
            "invalid_window",
            "the window needs an end: start_by (RFC 3339) or window_s (seconds)",
            "start_by",
        )
    if closes <= opens:
        raise BadAnnouncement(
            400,
            "invalid_window",
            "the window closes before it opens: start_by <= not_before",
            "start_by",
        )
    if closes - opens > MAX_WINDOW_S:
        raise BadAnnouncement(
            400,
            "invalid_window",
            f"the window is {closes - opens:.0f} s long; at most {MAX_WINDOW_S:.0f} s (24 h)",
            "start_by" if "start_by" in body else "window_s",
        )
    if closes <= now:
        raise BadAnnouncement(
            400,
            "invalid_window",
            "the window has already closed: start_by is in the past",
            "start_by",
        )
    count = body.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise BadAnnouncement(
            400,
            "invalid_count",
            f"count must be a whole number from 1 to {MAX_COUNT}, got {_short(count)}",
            "count",
        )
    priority = body.get("priority", default_priority)
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int | float)
        or not math.isfinite(priority)
    ):
        raise BadAnnouncement(
            400,
            "invalid_priority",
            f"priority must be a number, got {_short(priority)}",
            "priority",
        )
    return _Fields(model, opens, closes, count, float(priority))


def _time(value: object, name: str) -> float:
    if not isinstance(value, str):
        raise BadAnnouncement(
            400,
            "invalid_window",
            f"{name} must be an RFC 3339 time with a zone, like 2026-05-01T13:50:00Z",
            name,
        )
    epoch = rfc3339_epoch(value)
    if epoch is None:
        raise BadAnnouncement(
            400,
            "invalid_window",
            f"{name} must be an RFC 3339 time with a zone, like 2026-05-01T13:50:00Z; "
            f"got {value.strip()!r}",
            name,
        )
    if not -62135596800.0 < epoch < 253402214400.0:
        raise BadAnnouncement(
            400, "invalid_window", f"{name} must fall between the years 0001 and 9999", name
        )
    return epoch


def _seconds(value: object, name: str, *, zero: bool) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
        or value > 10 * 365 * 86400
    ):
        least = ">= 0" if zero else "> 0"
        raise BadAnnouncement(
            400,
            "invalid_window",
            f"{name} must be a number of seconds {least} (at most ten years), got {_short(value)}",
            name,
        )
    return float(value)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _rfc3339(epoch: float) -> str:
    return (
        datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def _label(epoch: float, now: float) -> str:
    return wall_label(epoch, now)
