"""The Batch API's files, batches and lines in a cluster's PostgreSQL.

:class:`PgBatchStore` has the methods of :class:`yard.batches.store.BatchStore`
(the SQLite one), so :class:`yard.batches.service.Batches` runs on either,
and keeps the same rules:

- An upload, a new batch, and every change that decides what a restart does
  is one transaction (PostgreSQL's commit is synced).
- A line becomes a job of the shared queue (a row of ``jobs``, unclaimed,
  with its ``rank`` in the one priority order, and ``NOTIFY yard_jobs``) in
  the same transaction that records its ``job_id``: whichever node drives
  the batch, a line is either a job or not, never two; any node may claim it.
- A line's outcome is written once; a batch ends once.

And one of its own: **one driver per batch.** ``batches.driver`` names the
node that validates the batch, hands its lines in, records their outcomes
and writes its files. A node takes a batch (:meth:`PgBatchStore.adopt`) only
if nobody drives it, it drives it already, or its driver is not ``up`` in the
node registry (declared gone by a heartbeat check, or left). Two drivers at
once (a node declared gone while it was alive, until it notices) are safe,
only wasteful: every write above is conditional.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import psycopg

from yard.batches.records import (
    BatchError,
    BatchRecord,
    BatchStatus,
    FileRecord,
    LineRecord,
    ParsedLine,
)
from yard.batches.rows import batch_from_row, file_from_row, line_from_row
from yard.batches.store import FileLimit
from yard.cluster.jobs import PgJobStore, rank_of
from yard.cluster.pg import PgDatabase, Row
from yard.cluster.schema import JOBS_CHANNEL
from yard.jobs.records import JobRecord
from yard.jobs.rows import dump_headers as _dump_headers

__all__ = ["PgBatchStore"]

_FILE_COLUMNS = "seq, id, app, purpose, filename, bytes, created_at"
_BATCH_COLUMNS = (
    "seq, id, app, endpoint, input_file_id, completion_window, metadata, priority, "
    "rerun_safe, status, created_at, expires_at, in_progress_at, finalizing_at, "
    "completed_at, failed_at, expired_at, cancelling_at, cancelled_at, errors, "
    "output_file_id, error_file_id, total, completed, failed"
)
_LINE_COLUMNS = "batch_id, idx, line, custom_id, model, backend, job_id, outcome"
_UNENDED = "('validating', 'in_progress', 'finalizing', 'cancelling')"
_FREE = (
    "(driver IS NULL OR driver = %s OR NOT EXISTS "
    "(SELECT 1 FROM nodes WHERE nodes.name = batches.driver AND nodes.state = 'up'))"
)
"""A batch this node may drive: nobody's, its own, or a node's that is not up."""


class PgBatchStore:
    """Files, batches and lines of a cluster, as seen from one node.

    jobs: this node's job store (same database); lines become its jobs.
    aging_rate: the scheduler's, for a line's rank in the one order.
    """

    def __init__(self, jobs: PgJobStore, *, aging_rate: float = 0.0) -> None:
        self.jobs = jobs
        self.node = jobs.node
        self._db: PgDatabase = jobs.database
        self._aging_rate = aging_rate

    # -- files ---------------------------------------------------------------

    async def add_file(
        self,
        *,
        file_id: str,
        app: str,
        purpose: str,
        filename: str,
        content: bytes,
        created_at: float,
        max_files: int | None = None,
    ) -> FileRecord:
        """Store a file. ``max_files``: raise :class:`FileLimit` if the app
        already keeps that many files of this purpose (checked under a per-app
        lock, so two nodes cannot both squeeze past it)."""

        def _add(conn: psycopg.Connection[Row]) -> None:
            if max_files is not None:
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"yard files {app}",))
                row = conn.execute(
                    "SELECT count(*) FROM files WHERE app = %s AND purpose = %s", (app, purpose)
                ).fetchone()
                assert row is not None
                if int(row[0]) >= max_files:
                    raise FileLimit(int(row[0]))
            _insert_file(conn, file_id, app, purpose, filename, content, created_at)

        await self._db.transaction(_add)
        record = await self.file(file_id)
        assert record is not None
        return record

    async def file(self, file_id: str) -> FileRecord | None:
        row = await self._db.fetchone(
            f"SELECT {_FILE_COLUMNS} FROM files WHERE id = %s", (file_id,)
        )
        return None if row is None else file_from_row(row)

    async def content(self, file_id: str) -> bytes | None:
        row = await self._db.fetchone(
            "SELECT body FROM file_contents WHERE file_id = %s", (file_id,)
        )
        return None if row is None else bytes(row[0])

    async def list_files(
        self,
        *,
        app: str | None,
        purpose: str | None,
        limit: int,
        after_seq: int | None,
        ascending: bool,
    ) -> list[FileRecord]:
        where: list[str] = []
        params: list[object] = []
        if app is not None:
            where.append("app = %s")
            params.append(app)
        if purpose is not None:
            where.append("purpose = %s")
            params.append(purpose)
        if after_seq is not None:
            where.append("seq > %s" if ascending else "seq < %s")
            params.append(after_seq)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        order = "ASC" if ascending else "DESC"
        rows = await self._db.fetchall(
            f"SELECT {_FILE_COLUMNS} FROM files {clause} ORDER BY seq {order} LIMIT %s",
            (*params, limit),
        )
        return [file_from_row(row) for row in rows]

    async def delete_file(self, file_id: str) -> bool:
        changed = await self._db.execute("DELETE FROM files WHERE id = %s", (file_id,))
        return changed == 1

    # -- batches -------------------------------------------------------------

    async def add_batch(
        self,
        *,
        batch_id: str,
        app: str,
        endpoint: str,
        input_file_id: str,
        completion_window: str,
        metadata: dict[str, str] | None,
        priority: float,
        rerun_safe: bool,
        created_at: float,
        expires_at: float,
    ) -> BatchRecord:
        """Record a new batch as ``validating``, driven by this node."""
        await self._db.execute(
            "INSERT INTO batches (id, app, endpoint, input_file_id, completion_window, "
            "metadata, priority, rerun_safe, status, created_at, expires_at, driver) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'validating', %s, %s, %s)",
            (
                batch_id,
                app,
                endpoint,
                input_file_id,
                completion_window,
                None if metadata is None else json.dumps(metadata),
                priority,
                rerun_safe,
                created_at,
                expires_at,
                self.node,
            ),
        )
        batch = await self.batch(batch_id)
        assert batch is not None
        return batch

    async def batch(self, batch_id: str) -> BatchRecord | None:
        row = await self._db.fetchone(
            f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id = %s", (batch_id,)
        )
        return None if row is None else batch_from_row(row)

    async def list_batches(
        self, *, app: str | None, limit: int, before_seq: int | None
    ) -> list[BatchRecord]:
        """Batches newest first (of ``app``; None: all), older than ``before_seq``."""
        where: list[str] = []
        params: list[object] = []
        if app is not None:
            where.append("app = %s")
            params.append(app)
        if before_seq is not None:
            where.append("seq < %s")
            params.append(before_seq)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self._db.fetchall(
            f"SELECT {_BATCH_COLUMNS} FROM batches {clause} ORDER BY seq DESC LIMIT %s",
            (*params, limit),
        )
        return [batch_from_row(row) for row in rows]

    async def unended(self) -> list[BatchRecord]:
        """The batches that have not ended and that this node may drive
        (see :meth:`adopt`), oldest first."""
        rows = await self._db.fetchall(
            f"SELECT {_BATCH_COLUMNS} FROM batches WHERE status IN {_UNENDED} AND "
            f"{_FREE} ORDER BY seq",
            (self.node,),
        )
        return [batch_from_row(row) for row in rows]

    async def adopt(self, batch_id: str) -> bool:
        """Make this node the batch's driver, if it has not ended and nobody
        else alive drives it. True if this node drives it now."""
        changed = await self._db.execute(
            f"UPDATE batches SET driver = %s WHERE id = %s AND status IN {_UNENDED} AND {_FREE}",
            (self.node, batch_id, self.node),
        )
        return changed == 1

    async def drives(self, batch_id: str) -> bool:
        """Whether this node is (still) the batch's driver."""
        row = await self._db.fetchone("SELECT driver FROM batches WHERE id = %s", (batch_id,))
        return row is not None and row[0] == self.node

    async def release(self) -> int:
        """Give up driving every batch this node drives (a graceful stop), so
        that another node takes them over at once. Returns how many."""
        return await self._db.execute(
            "UPDATE batches SET driver = NULL WHERE driver = %s", (self.node,)
        )

    async def fail(self, batch_id: str, errors: Sequence[BatchError], *, at: float) -> bool:
        """validating -> failed, with ``errors``."""
        text = json.dumps(
            [
                {"code": e.code, "message": e.message, "param": e.param, "line": e.line}
                for e in errors
            ]
        )
        changed = await self._db.execute(
            "UPDATE batches SET status = 'failed', failed_at = %s, errors = %s, driver = NULL "
            "WHERE id = %s AND status = 'validating'",
            (at, text, batch_id),
        )
        return changed == 1

    async def start(self, batch_id: str, lines: Sequence[ParsedLine], *, at: float) -> bool:
        """validating -> in_progress, with its lines written (in submission
        order), in one transaction. False if it was not validating."""

        def _start(conn: psycopg.Connection[Row]) -> bool:
            cursor = conn.execute(
                "UPDATE batches SET status = 'in_progress', in_progress_at = %s, total = %s "
                "WHERE id = %s AND status = 'validating'",
                (at, len(lines), batch_id),
            )
            if cursor.rowcount != 1:
                return False
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO batch_lines (batch_id, idx, line, custom_id, model, backend, "
                    "body) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    [
                        (batch_id, i, p.line, p.custom_id, p.model, p.backend, p.body)
                        for i, p in enumerate(lines)
                    ],
                )
            return True

        return await self._db.transaction(_start)

    async def mark_cancelling(self, batch_id: str, *, at: float) -> bool:
        """validating or in_progress -> cancelling (from any node)."""
        changed = await self._db.execute(
            "UPDATE batches SET status = 'cancelling', cancelling_at = %s "
            "WHERE id = %s AND status IN ('validating', 'in_progress')",
            (at, batch_id),
        )
        return changed == 1

    async def mark_finalizing(self, batch_id: str, *, at: float) -> bool:
        """in_progress -> finalizing (a cancelling batch stays cancelling)."""
        changed = await self._db.execute(
            "UPDATE batches SET status = 'finalizing', finalizing_at = %s "
            "WHERE id = %s AND status = 'in_progress'",
            (at, batch_id),
        )
        return changed == 1

    async def finish(
        self,
        batch: BatchRecord,
        status: BatchStatus,
        *,
        at: float,
        output_file_id: str,
        error_file_id: str,
        errors: Sequence[BatchError] = (),
    ) -> bool:
        """End a batch with ``status`` (completed, expired, cancelled, or
        failed with ``errors`` when its driver failed): write its
        output and error files from its lines' outcomes (in input order; a file
        only if it has lines), set its counts, forget its lines. One
        transaction; False if the batch had already ended."""
        stamp = {
            "completed": "completed_at",
            "expired": "expired_at",
            "cancelled": "cancelled_at",
            "failed": "failed_at",
        }[status]
        stored_errors = None
        if errors:
            stored_errors = json.dumps(
                [
                    {"code": e.code, "message": e.message, "param": e.param, "line": e.line}
                    for e in errors
                ]
            )

        def _finish(conn: psycopg.Connection[Row]) -> bool:
            rows = conn.execute(
                "SELECT outcome, output FROM batch_lines WHERE batch_id = %s ORDER BY line",
                (batch.id,),
            ).fetchall()
            ok = [str(out) for outcome, out in rows if outcome == "ok"]
            bad = [str(out) for outcome, out in rows if outcome != "ok" and out is not None]
            cursor = conn.execute(
                f"UPDATE batches SET status = %s, {stamp} = %s, "
                "finalizing_at = COALESCE(finalizing_at, %s), output_file_id = %s, "
                "error_file_id = %s, completed = %s, failed = %s, "
                "errors = COALESCE(%s, errors), driver = NULL "
                f"WHERE id = %s AND status IN {_UNENDED}",
                (
                    status,
                    at,
                    at,
                    output_file_id if ok else None,
                    error_file_id if bad else None,
                    len(ok),
                    len(bad),
                    stored_errors,
                    batch.id,
                ),
            )
            if cursor.rowcount != 1:
                return False
            for file_id, lines, name in (
                (output_file_id, ok, "output"),
                (error_file_id, bad, "error"),
            ):
                if lines:
                    content = ("\n".join(lines) + "\n").encode()
                    filename = f"{batch.id}_{name}.jsonl"
                    _insert_file(conn, file_id, batch.app, "batch_output", filename, content, at)
            conn.execute("DELETE FROM batch_lines WHERE batch_id = %s", (batch.id,))
            return True

        return await self._db.transaction(_finish)

    # -- lines ---------------------------------------------------------------

    async def lines(self, batch_id: str) -> list[LineRecord]:
        """A batch's lines in submission order (without bodies)."""

        def _lines(conn: psycopg.Connection[Row]) -> list[LineRecord]:
            # The records are made in the worker thread, off the event loop.
            rows = conn.execute(
                f"SELECT {_LINE_COLUMNS} FROM batch_lines WHERE batch_id = %s ORDER BY idx",
                (batch_id,),
            ).fetchall()
            return [line_from_row(row) for row in rows]

        return await self._db.transaction(_lines)

    async def counts(self, batch_id: str) -> tuple[int, int, int]:
        """(completed, failed, expired) lines of a running batch so far; the
        expired ones are among the failed."""
        row = await self._db.fetchone(
            "SELECT count(*) FILTER (WHERE outcome = 'ok'), "
            "count(*) FILTER (WHERE outcome IN ('error', 'expired')), "
            "count(*) FILTER (WHERE outcome = 'expired') FROM batch_lines WHERE batch_id = %s",
            (batch_id,),
        )
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    async def submit(
        self,
        line: LineRecord,
        *,
        job_id: str,
        app: str,
        priority: float,
        start_by: float | None,
        rerun_safe: bool,
        created_at: float,
        path: str,
    ) -> JobRecord | None:
        """Make the line a queued, unclaimed job of the shared queue (its
        request moves from the line to the job) and wake the nodes, in one
        transaction. None if it already was one or has ended."""
        rank = rank_of(priority, created_at, self._aging_rate)
        headers = _dump_headers(((b"content-type", b"application/json"),))

        def _submit(conn: psycopg.Connection[Row]) -> bool:
            row = conn.execute(
                "SELECT body FROM batch_lines WHERE batch_id = %s AND idx = %s "
                "AND job_id IS NULL AND outcome IS NULL FOR UPDATE",
                (line.batch_id, line.idx),
            ).fetchone()
            if row is None or row[0] is None:
                return False
            body = bytes(row[0])
            conn.execute(
                "INSERT INTO jobs (id, app, model, backend, priority, start_by, allow_late, "
                "rerun_safe, status, created_at, request_bytes, rank, origin) "
                "VALUES (%s, %s, %s, %s, %s, %s, false, %s, 'queued', %s, %s, %s, %s)",
                (
                    job_id,
                    app,
                    line.model,
                    line.backend,
                    priority,
                    start_by,
                    rerun_safe,
                    created_at,
                    len(body),
                    rank,
                    self.node,
                ),
            )
            conn.execute(
                "INSERT INTO job_requests (job_id, method, path, query, headers, body) "
                "VALUES (%s, 'POST', %s, '', %s, %s)",
                (job_id, path, headers, body),
            )
            conn.execute(
                "UPDATE batch_lines SET job_id = %s, body = NULL WHERE batch_id = %s AND idx = %s",
                (job_id, line.batch_id, line.idx),
            )
            conn.execute("SELECT pg_notify(%s, %s)", (JOBS_CHANNEL, line.backend))
            return True

        if not await self._db.transaction(_submit):
            return None
        return await self.jobs.get(job_id)

    async def record(self, line: LineRecord, *, outcome: str, output: str) -> bool:
        """Store the line's outcome (``ok``, ``error``, ``expired``) and its
        output- or error-file line, once."""
        changed = await self._db.execute(
            "UPDATE batch_lines SET outcome = %s, output = %s, body = NULL "
            "WHERE batch_id = %s AND idx = %s AND outcome IS NULL",
            (outcome, output, line.batch_id, line.idx),
        )
        return changed == 1

    async def record_many(self, ended: Sequence[tuple[LineRecord, str, str]]) -> int:
        """:meth:`record` for many lines ((line, outcome, output) each) in one
        transaction. Returns how many were recorded now."""

        def _record(conn: psycopg.Connection[Row]) -> int:
            count = 0
            with conn.cursor() as cur:
                for line, outcome, output in ended:
                    cur.execute(
                        "UPDATE batch_lines SET outcome = %s, output = %s, body = NULL "
                        "WHERE batch_id = %s AND idx = %s AND outcome IS NULL",
                        (outcome, output, line.batch_id, line.idx),
                    )
                    count += max(0, cur.rowcount)
            return count

        return await self._db.transaction(_record)

    async def service_times(self, backend: str, *, limit: int = 20) -> list[float]:
        """The run times (start to end, seconds) of the latest jobs on
        ``backend``, on any node, that succeeded."""
        rows = await self._db.fetchall(
            "SELECT finished_at - started_at FROM jobs WHERE backend = %s AND "
            "started_at IS NOT NULL AND finished_at IS NOT NULL AND error_code IS NULL "
            "AND result_status IS NOT NULL ORDER BY finished_at DESC LIMIT %s",
            (backend, limit),
        )
        times = [float(r[0]) for r in rows if r[0] is not None]
        return [t for t in times if t >= 0]


def _insert_file(
    conn: psycopg.Connection[Row],
    file_id: str,
    app: str,
    purpose: str,
    filename: str,
    content: bytes,
    created_at: float,
) -> None:
    conn.execute(
        "INSERT INTO files (id, app, purpose, filename, bytes, created_at) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        (file_id, app, purpose, filename, len(content), created_at),
    )
    conn.execute("INSERT INTO file_contents (file_id, body) VALUES (%s, %s)", (file_id, content))
