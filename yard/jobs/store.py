"""The durable record of async jobs: :class:`JobStore`, over either database.

One yard keeps it in SQLite (``data_dir/jobs.sqlite``, the tables of
:data:`yard.jobs.schema.MIGRATIONS`); the nodes of a cluster share one
PostgreSQL, where :class:`yard.cluster.jobs.ClusterJobStore` adds claims to
the same queries. Rules this module keeps:

- A job row is written with ``durable=True`` before yard promises anything
  about it (the 202), and every change of status that decides whether the job
  may run again after a crash (running, requeued, finished) is durable too.
- A job ends exactly once: every move to a final status is a conditional
  update (``WHERE status IN ('queued', 'running')``) and says whether it won.
  Every end is announced (:data:`~yard.jobs.schema.ENDED_CHANNEL`), and so is
  a new job (:data:`~yard.jobs.schema.JOBS_CHANNEL`), in its transaction.
- Quotas are checked under a per-app lock (:meth:`yard.db.Tx.lock`), in the
  transaction of the insert, so two jobs at once cannot both squeeze in.
- Times are wall-clock epochs (seconds); the engine clock does not survive a
  restart, the epoch does.
- Request and result bytes live in their own tables, so that listing and
  reading jobs never touches the blobs; they are deleted when the job
  expires. A row becomes a record in :mod:`yard.jobs.rows`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NotRequired, TypedDict, Unpack, cast

from yard.db import Database, SqliteDatabase, Tx, insert, marks, where_clause
from yard.jobs.records import (
    STATUSES,
    UNFINISHED,
    JobError,
    JobRecord,
    Quota,
    QuotaExceeded,
    Status,
    StoredRequest,
    StoredResult,
    Usage,
)
from yard.jobs.rows import COLUMNS, dump_headers, job_record, load_headers
from yard.jobs.schema import ENDED_CHANNEL, JOBS_CHANNEL, MIGRATIONS

__all__ = [
    "STATUSES",
    "UNFINISHED",
    "JobError",
    "JobRecord",
    "JobStore",
    "NewJob",
    "Quota",
    "QuotaExceeded",
    "Status",
    "StoredRequest",
    "StoredResult",
    "Usage",
]

_ENDED = "('succeeded', 'failed', 'cancelled')"


class NewJob(TypedDict):
    """A new job's own fields, as :meth:`JobStore.insert` and
    :meth:`JobStore.insert_row` take them (keywords). Times are epochs;
    ``not_before`` is None (or left out) for a job that may start at once."""

    job_id: str
    app: str
    model: str
    backend: str
    priority: float
    start_by: float | None
    allow_late: bool
    rerun_safe: bool
    created_at: float
    request: StoredRequest
    not_before: NotRequired[float | None]


class JobStore:
    """The jobs of one yard (or, as :class:`yard.cluster.jobs.ClusterJobStore`,
    of a cluster). ``db``: opened with the job tables; :meth:`open` opens
    SQLite. Close with :meth:`close`."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @classmethod
    async def open(cls, path: Path, *, threaded: bool = True) -> JobStore:
        """Open (create, migrate) the SQLite job database at ``path``.
        ``threaded=False``: see :meth:`yard.db.SqliteDatabase.open` (tests only)."""
        return cls(await SqliteDatabase.open(path, MIGRATIONS, threaded=threaded))

    @property
    def database(self) -> Database:
        """The database itself, for the Batch API's and the announcements' tables."""
        return self._db

    async def close(self) -> None:
        await self._db.close()

    # -- writes --------------------------------------------------------------

    async def insert(self, *, quota: Quota | None = None, **job: Unpack[NewJob]) -> JobRecord:
        """Record a new queued job (:class:`NewJob`) and its request, durably
        (on disk, synced, when this returns), and announce it.

        quota: the app's; raises :class:`QuotaExceeded` (and stores nothing)
        if the job would take the app past it.
        """
        app, size = job["app"], len(job["request"].body)

        def _insert(tx: Tx) -> JobRecord:
            if quota is not None:
                tx.lock(f"yard quota {app}")
                usage = _usage(tx, app)
                if usage.jobs >= quota.max_jobs or usage.bytes + size > quota.max_bytes:
                    raise QuotaExceeded(usage, quota, size)
            return self.insert_row(tx, **job)

        return await self._db.transaction(_insert, durable=True)

    def insert_row(self, tx: Tx, **job: Unpack[NewJob]) -> JobRecord:
        """Write a new queued job (:class:`NewJob`) and its request inside the
        caller's transaction and announce it (:meth:`insert`, and a batch line
        becoming a job)."""
        request = job["request"]
        values = {
            "id": job["job_id"],
            "app": job["app"],
            "model": job["model"],
            "backend": job["backend"],
            "priority": job["priority"],
            "start_by": job["start_by"],
            "allow_late": job["allow_late"],
            "rerun_safe": job["rerun_safe"],
            "status": "queued",
            "created_at": job["created_at"],
            "request_bytes": len(request.body),
            "not_before": job.get("not_before"),
            **self._placed(job["priority"], job["created_at"]),
        }
        row = insert(tx, "jobs", values, returning=COLUMNS).fetchall()[0]
        insert(
            tx,
            "job_requests",
            {
                "job_id": job["job_id"],
                "method": request.method,
                "path": request.path,
                "query": request.query,
                "headers": dump_headers(request.headers),
                "body": request.body,
            },
        )
        tx.notify(JOBS_CHANNEL, job["backend"])
        return job_record(row)

    def _placed(self, priority: float, created_at: float) -> dict[str, object]:
        """Columns a new job gets beyond its own fields (a cluster's order)."""
        return {}

    async def delete(self, job_id: str) -> None:
        """Forget a job entirely (one that was never accepted)."""
        await self._db.execute("DELETE FROM jobs WHERE id = ?", (job_id,), durable=True)

    async def mark_running(self, job_id: str, *, at: float, queued_s: float) -> bool:
        """Queued -> running (or running again, after a requeue), durably,
        before its request goes upstream. False if the job has ended
        (cancelled meanwhile)."""
        changed = await self._db.execute(
            "UPDATE jobs SET status = 'running', started_at = ?, queued_s = ? "
            "WHERE id = ? AND status IN ('queued', 'running')",
            (at, queued_s, job_id),
            durable=True,
        )
        return changed == 1

    async def mark_requeue_spent(self, job_id: str) -> None:
        """Its one requeue after a self-caused OOM may be used now: never grant
        another (kept for good, across restarts)."""
        await self._db.execute(
            "UPDATE jobs SET requeued = true WHERE id = ?", (job_id,), durable=True
        )

    async def mark_requeued(self, job_id: str) -> bool:
        """Running -> queued: the core put it back after a self-caused OOM."""
        return await self._requeue(job_id, "")

    async def _requeue(self, job_id: str, where: str, *params: object) -> bool:
        changed = await self._db.execute(
            "UPDATE jobs SET status = 'queued', requeued = true, started_at = NULL "
            f"WHERE id = ? AND status = 'running'{where}",
            (job_id, *params),
            durable=True,
        )
        return changed == 1

    async def mark_rerun(self, job_id: str) -> bool:
        """Running -> queued after a restart, for a job the client marked
        rerun-safe; the one rerun is spent."""
        changed = await self._db.execute(
            "UPDATE jobs SET status = 'queued', rerun_used = true, started_at = NULL "
            "WHERE id = ? AND status = 'running' AND rerun_safe AND NOT rerun_used",
            (job_id,),
            durable=True,
        )
        return changed == 1

    async def finish(
        self,
        job_id: str,
        status: Status,
        *,
        at: float,
        error: JobError | None = None,
        result: StoredResult | None = None,
    ) -> bool:
        """End an unfinished job with ``status`` (and its error or result),
        durably. False if it had already ended: the first end wins."""
        return await self._finish(job_id, status, at, error, result, "")

    async def end_run(
        self,
        job_id: str,
        status: Status,
        *,
        at: float,
        error: JobError | None = None,
        result: StoredResult | None = None,
    ) -> bool:
        """End a job whose run this yard made (its runner's end, kept for the
        database or not), as :meth:`finish`; a cluster's store also requires
        that this node still holds it."""
        return await self.finish(job_id, status, at=at, error=error, result=result)

    async def _finish(
        self,
        job_id: str,
        status: Status,
        at: float,
        error: JobError | None,
        result: StoredResult | None,
        where: str,
        *params: object,
    ) -> bool:
        if status in UNFINISHED:
            raise ValueError(f"finish() needs a final status, not {status!r}")

        def _end(tx: Tx) -> bool:
            cursor = tx.execute(
                "UPDATE jobs SET status = ?, finished_at = ?, error_code = ?, "
                "error_message = ?, error_status = ?, result_status = ?, result_bytes = ?, "
                f"result_type = ? WHERE id = ? AND status IN ('queued', 'running'){where}",
                (
                    status,
                    at,
                    None if error is None else error.code,
                    None if error is None else error.message,
                    None if error is None else error.status,
                    None if result is None else result.status,
                    None if result is None else len(result.body),
                    None if result is None else result.content_type,
                    job_id,
                    *params,
                ),
            )
            if cursor.rowcount != 1:
                return False
            tx.notify(ENDED_CHANNEL, job_id)
            # Its request will never run again: drop the bytes now.
            tx.execute("DELETE FROM job_requests WHERE job_id = ?", (job_id,))
            if result is not None:
                insert(
                    tx,
                    "job_results",
                    {
                        "job_id": job_id,
                        "status": result.status,
                        "headers": dump_headers(result.headers),
                        "body": result.body,
                    },
                )
            return True

        return await self._db.transaction(_end, durable=True)

    async def expire(self, *, finished_before: float) -> list[str]:
        """Jobs that ended before ``finished_before`` become ``expired`` and
        their results are deleted. Returns their ids."""

        def _expire(tx: Tx) -> list[str]:
            ids = [
                str(row[0])
                for row in tx.execute(
                    f"UPDATE jobs SET status = 'expired' WHERE status IN {_ENDED} "
                    "AND finished_at < ? RETURNING id",
                    (finished_before,),
                ).fetchall()
            ]
            if ids:
                tx.execute(f"DELETE FROM job_results WHERE job_id IN ({marks(len(ids))})", ids)
            return ids

        return await self._db.transaction(_expire)

    async def forget_result(self, job_id: str) -> bool:
        """An ended job becomes ``expired`` now and its result is deleted (the
        client has what it needs, or does not want it). False if the job has
        not ended (or does not exist)."""

        def _forget(tx: Tx) -> bool:
            cursor = tx.execute(
                "UPDATE jobs SET status = 'expired' WHERE id = ? AND status IN "
                "('succeeded', 'failed', 'cancelled', 'expired')",
                (job_id,),
            )
            tx.execute("DELETE FROM job_results WHERE job_id = ?", (job_id,))
            return cursor.rowcount == 1

        return await self._db.transaction(_forget, durable=True)

    async def usage(self, app: str) -> Usage:
        """What ``app`` keeps stored now (see :class:`Quota`)."""
        return await self._db.transaction(lambda tx: _usage(tx, app))

    async def purge(self, *, finished_before: float) -> int:
        """Forget expired jobs that ended before ``finished_before``."""
        return await self._db.execute(
            "DELETE FROM jobs WHERE status = 'expired' AND finished_at < ?", (finished_before,)
        )

    # -- reads ---------------------------------------------------------------

    async def get(self, job_id: str) -> JobRecord | None:
        row = await self._db.fetchone(f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (job_id,))
        return None if row is None else job_record(row)

    async def list_jobs(
        self,
        *,
        app: str | None,
        statuses: Sequence[Status] = (),
        limit: int = 20,
        before_seq: int | None = None,
    ) -> list[JobRecord]:
        """Jobs newest first: of ``app`` (None: every app), with one of
        ``statuses`` (empty: any), older than ``before_seq`` (a cursor)."""
        clause, params = where_clause(
            {
                "app = ?": app,
                f"status IN ({marks(len(statuses))})": list(statuses) or None,
                "seq < ?": before_seq,
            }
        )
        rows = await self._db.fetchall(
            f"SELECT {COLUMNS} FROM jobs {clause} ORDER BY seq DESC LIMIT ?", (*params, limit)
        )
        return [job_record(row) for row in rows]

    async def unfinished(self) -> list[JobRecord]:
        """Queued and running jobs, in arrival order (for a restart)."""
        rows = await self._db.fetchall(
            f"SELECT {COLUMNS} FROM jobs WHERE status IN ('queued', 'running') ORDER BY seq"
        )
        return [job_record(row) for row in rows]

    async def request(self, job_id: str) -> StoredRequest | None:
        row = await self._db.fetchone(
            "SELECT method, path, query, headers, body FROM job_requests WHERE job_id = ?",
            (job_id,),
        )
        if row is None:
            return None
        method, path, query, headers, body = row
        return StoredRequest(
            method=str(method),
            path=str(path),
            query=str(query),
            headers=load_headers(str(headers)),
            body=bytes(body),
        )

    async def result(self, job_id: str) -> StoredResult | None:
        row = await self._db.fetchone(
            "SELECT status, headers, body FROM job_results WHERE job_id = ?", (job_id,)
        )
        if row is None:
            return None
        status, headers, body = row
        return StoredResult(
            status=int(status), headers=load_headers(str(headers)), body=bytes(body)
        )

    async def counts(self) -> dict[str, int]:
        """How many jobs are in each status."""
        rows = await self._db.fetchall("SELECT status, count(*) FROM jobs GROUP BY status")
        found = {str(status): int(n) for status, n in rows}
        return {status: found.get(status, 0) for status in STATUSES}


def _usage(tx: Tx, app: str) -> Usage:
    jobs, size, oldest = tx.execute(
        "SELECT count(*), "
        "COALESCE(SUM(CASE WHEN status IN ('queued', 'running') THEN request_bytes "
        "ELSE COALESCE(result_bytes, 0) END), 0), "
        "MIN(CASE WHEN status NOT IN ('queued', 'running') THEN finished_at END) "
        "FROM jobs WHERE app = ? AND status != 'expired'",
        (app,),
    ).fetchall()[0]
    return Usage(jobs=int(jobs), bytes=int(size), oldest_finished_at=_float_or_none(oldest))


def _float_or_none(value: object) -> float | None:
    try:
        return None if value is None else float(cast(float, value))
    except (TypeError, ValueError):
        return None
