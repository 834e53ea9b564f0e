"""Announcements, in the jobs database (SQLite: a node of a cluster keeps its
own): the durable record the core is told again after a restart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

from yard.db import Database, Tx, insert, where_clause

Status = Literal["open", "used", "expired", "withdrawn"]
Source = Literal["api", "config"]

_COLUMNS = (
    "seq, id, app, model, backend, not_before, start_by, count, used, priority, status, "
    "source, created_at, ended_at"
)

_NAMES = _COLUMNS.split(", ")

_INSERTED = [*_NAMES[1:10], "source", "created_at"]
"""What a new announcement's row is written with (its status: open)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnouncementRecord:
    """One announcement as stored. Times are epochs (seconds).

    not_before, start_by: the window ``[not_before, start_by)``.
    count: requests announced; used: how many came (written when it ends).
    priority: already clamped to the app's ``max_priority``.
    status: ``open`` until it ends ``used``, ``expired`` or ``withdrawn``.
    source: ``api`` (``POST /v1/announcements``) or ``config`` (recurring).
    """

    seq: int
    id: str
    app: str
    model: str
    backend: str
    not_before: float
    start_by: float
    count: int
    used: int
    priority: float
    status: Status
    source: Source
    created_at: float
    ended_at: float | None


class AnnouncementStore:
    """The ``announcements`` table of the jobs database (``database``: open)."""

    def __init__(self, database: Database) -> None:
        self._db = database

    async def insert(self, record: AnnouncementRecord, *, max_open: int | None = None) -> bool:
        """Store a new open announcement, durably. With ``max_open``: only if
        its app has fewer open ones than that (checked in the same transaction);
        False if it has that many already. An id already stored is not stored
        again (True: recurring announcements are made once)."""

        def _insert(tx: Tx) -> bool:
            if max_open is not None:
                (n,) = tx.execute(
                    "SELECT count(*) FROM announcements WHERE app = ? AND status = 'open' "
                    "AND source = 'api'",
                    (record.app,),
                ).fetchall()[0]
                if int(n) >= max_open:
                    return False
            values = {name: getattr(record, name) for name in _INSERTED}
            insert(tx, "announcements", {**values, "status": "open"}, conflict="DO NOTHING")
            return True

        return await self._db.transaction(_insert, durable=True)

    async def get(self, announcement_id: str) -> AnnouncementRecord | None:
        row = await self._db.fetchone(
            f"SELECT {_COLUMNS} FROM announcements WHERE id = ?", (announcement_id,)
        )
        return None if row is None else _record(row)

    async def listed(self, *, app: str | None, limit: int = 100) -> list[AnnouncementRecord]:
        """Newest first; ``app`` None: every app's."""
        clause, params = where_clause({"app = ?": app})
        rows = await self._db.fetchall(
            f"SELECT {_COLUMNS} FROM announcements {clause} ORDER BY seq DESC LIMIT ?",
            (*params, limit),
        )
        return [_record(row) for row in rows]

    async def open(self) -> list[AnnouncementRecord]:
        """Every open announcement, oldest first (to tell the core after a restart)."""
        rows = await self._db.fetchall(
            f"SELECT {_COLUMNS} FROM announcements WHERE status = 'open' ORDER BY seq"
        )
        return [_record(row) for row in rows]

    async def end(self, announcement_id: str, status: Status, used: int, at: float) -> bool:
        """Mark an open announcement ended; False if it was not open."""
        changed = await self._db.execute(
            "UPDATE announcements SET status = ?, used = ?, ended_at = ? "
            "WHERE id = ? AND status = 'open'",
            (status, used, at, announcement_id),
            durable=True,
        )
        return changed > 0

    async def set_used(self, announcement_id: str, used: int) -> None:
        """Record how many requests came for an announcement that already ended."""
        await self._db.execute(
            "UPDATE announcements SET used = ? WHERE id = ?", (used, announcement_id), durable=True
        )

    async def purge(self, *, ended_before: float, keep_per_app: int) -> int:
        """Delete the ended announcements that ended before ``ended_before``,
        and each app's ended ones beyond its newest ``keep_per_app``. Returns
        how many went."""
        return await self._db.execute(
            "DELETE FROM announcements WHERE status != 'open' AND (ended_at < ? OR seq IN "
            "(SELECT seq FROM (SELECT seq, row_number() OVER "
            "(PARTITION BY app ORDER BY seq DESC) AS n FROM announcements "
            "WHERE status != 'open') WHERE n > ?))",
            (ended_before, keep_per_app),
        )


def _record(row: tuple[object, ...]) -> AnnouncementRecord:
    c: dict[str, Any] = dict(zip(_NAMES, row, strict=True))
    return AnnouncementRecord(
        seq=int(c["seq"]),
        id=str(c["id"]),
        app=str(c["app"]),
        model=str(c["model"]),
        backend=str(c["backend"]),
        not_before=float(c["not_before"]),
        start_by=float(c["start_by"]),
        count=int(c["count"]),
        used=int(c["used"]),
        priority=float(c["priority"]),
        status=cast(Status, str(c["status"])),
        source=cast(Source, str(c["source"])),
        created_at=float(c["created_at"]),
        ended_at=None if c["ended_at"] is None else float(c["ended_at"]),
    )
