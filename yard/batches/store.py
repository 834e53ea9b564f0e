"""The Batch API's side of the job database: files, batches and their lines.

:class:`BatchStore` keeps them beside the jobs, in the job store's database
(SQLite for one yard; a cluster's PostgreSQL, where
:class:`yard.cluster.batches.ClusterBatchStore` adds which node drives each
batch). Rules this module keeps:

- An upload, a new batch, and every change that decides what a restart does
  (a batch's lines written, a line becoming a job, a line's outcome, the
  final files) is one durable transaction.
- A line becomes a job (:meth:`yard.jobs.store.JobStore.insert_row`) in the
  same transaction that records its ``job_id``: after any crash, whichever
  node drives the batch, a line is either a job or not, never two.
- A line's outcome is written once (``WHERE outcome IS NULL``).
- A batch ends once: its final status is a conditional update.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import trio

from yard.batches.records import (
    BatchError,
    BatchRecord,
    BatchStatus,
    FileRecord,
    LineRecord,
    ParsedLine,
    ParsedLines,
)
from yard.batches.rows import (
    BATCH_COLUMNS,
    FILE_COLUMNS,
    LINE_COLUMNS,
    UNENDED,
    batch_from_row,
    file_from_row,
    line_from_row,
)
from yard.db import Blob, Tx, insert, where_clause
from yard.jobs.store import JobRecord, JobStore, StoredRequest

_INSERT_CHUNK = 500
"""Lines of a new batch inserted between two hand-overs of the GIL."""


STREAM_PIECES = 4
"""Pieces of :data:`yard.db.BLOB_PIECE` a download reads at once
(:meth:`BatchStore.content_stream`), each read one short transaction: what a
download holds of its file. For a 200 MB file, 4 and 8 took as long (0.33 s
on SQLite; ``python -m bench.file_content --mb 200``); SQLite opens the file
at each read's offset and walks its pages from the start, cheap but not free
(:meth:`yard.db.SqliteDatabase.read_blob`)."""


class FileGone(Exception):
    """A file was deleted while it was read (:meth:`BatchStore.content_stream`)."""

    def __init__(self, file_id: str, at: int, length: int) -> None:
        super().__init__(
            f"file {file_id!r} was deleted while it was read ({at} of its {length} bytes"
            " were read); the download ends short of its Content-Length"
        )
        self.file_id = file_id


@dataclass(frozen=True, slots=True, kw_only=True)
class FileStream:
    """A stored file as it is read (:meth:`BatchStore.content_stream`).

    length: the file's size in bytes (what ``Content-Length`` says).
    pieces: its bytes, a piece at a time, read as they are taken; raises
        :class:`FileGone` if the file is deleted before its end.
    """

    length: int
    pieces: AsyncIterator[bytes]


class FileLimit(Exception):
    """The app keeps as many files as it may."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} files")
        self.count = count


class BatchStore:
    """Files, batches and lines, in the database of ``jobs`` (their lines
    become its jobs)."""

    _UNDRIVEN = ""
    """What else an ended batch's row is set to (``, driver = NULL``)."""

    def __init__(self, jobs: JobStore) -> None:
        self.jobs = jobs
        self._db = jobs.database

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
        """Store a file durably. ``max_files``: raise :class:`FileLimit` if the
        app already keeps that many files of this purpose (checked under a
        per-app lock, so two nodes cannot both squeeze past it)."""

        def _add(tx: Tx) -> FileRecord:
            if max_files is not None:
                tx.lock(f"yard files {app}")
                (count,) = tx.execute(
                    "SELECT count(*) FROM files WHERE app = ? AND purpose = ?", (app, purpose)
                ).fetchall()[0]
                if int(count) >= max_files:
                    raise FileLimit(int(count))
            return _insert_file(tx, file_id, app, purpose, filename, content, created_at)

        return await self._db.transaction(_add, durable=True)

    async def file(self, file_id: str) -> FileRecord | None:
        row = await self._db.fetchone(f"SELECT {FILE_COLUMNS} FROM files WHERE id = ?", (file_id,))
        return None if row is None else file_from_row(row)

    async def content(self, file_id: str) -> bytes | None:
        """The file's bytes (None: no such file), read in one transaction a
        piece at a time (:meth:`yard.db.Database.read_blob`) and joined in a
        worker thread. For a whole file in memory; a download streams it
        (:meth:`content_stream`)."""
        blob = await self._read(file_id, 0, None)
        if blob is None:
            return None
        if len(blob.pieces) <= 1:
            return b"".join(blob.pieces)
        return await trio.to_thread.run_sync(b"".join, blob.pieces)

    async def content_stream(
        self, file_id: str, *, pieces_at_once: int = STREAM_PIECES
    ) -> FileStream | None:
        """The file's bytes as they are read (None: no such file): its first
        ``pieces_at_once`` pieces are read now, the next ones each time those
        are taken, each read in a transaction of its own, by offset (a stored
        file never changes). A download so holds a few MiB of the file at a
        time, sends its first byte after the first read, and leaves no
        transaction open while its client is slow.

        Iterating the stream raises :class:`FileGone` if the file is deleted
        before it is read to the end."""
        first = await self._read(file_id, 0, pieces_at_once)
        if first is None:
            return None
        return FileStream(length=first.length, pieces=self._pieces(file_id, first, pieces_at_once))

    async def _pieces(self, file_id: str, first: Blob, pieces_at_once: int) -> AsyncIterator[bytes]:
        length, at = first.length, 0
        pieces = first.pieces
        del first  # each piece is let go of once it is sent
        while True:
            while pieces:
                piece = pieces.pop(0)
                at += len(piece)
                yield piece
                del piece
            if at >= length:
                return
            read = await self._read(file_id, at, pieces_at_once)
            if read is None or read.length != length or not read.pieces:
                raise FileGone(file_id, at, length)
            pieces = read.pieces
            del read

    async def _read(self, file_id: str, start: int, pieces: int | None) -> Blob | None:
        return await self._db.read_blob(
            "file_contents", "body", "file_id", file_id, start=start, pieces=pieces
        )

    async def list_files(
        self,
        *,
        app: str | None,
        purpose: str | None,
        limit: int,
        after_seq: int | None,
        ascending: bool,
    ) -> list[FileRecord]:
        clause, params = where_clause(
            {
                "app = ?": app,
                "purpose = ?": purpose,
                f"seq {'>' if ascending else '<'} ?": after_seq,
            }
        )
        order = "ASC" if ascending else "DESC"
        rows = await self._db.fetchall(
            f"SELECT {FILE_COLUMNS} FROM files {clause} ORDER BY seq {order} LIMIT ?",
            (*params, limit),
        )
        return [file_from_row(row) for row in rows]

    async def delete_file(self, file_id: str) -> bool:
        changed = await self._db.execute("DELETE FROM files WHERE id = ?", (file_id,), durable=True)
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
        """Record a new batch as ``validating``, durably."""
        values = {
            "id": batch_id,
            "app": app,
            "endpoint": endpoint,
            "input_file_id": input_file_id,
            "completion_window": completion_window,
            "metadata": None if metadata is None else json.dumps(metadata),
            "priority": priority,
            "rerun_safe": rerun_safe,
            "status": "validating",
            "created_at": created_at,
            "expires_at": expires_at,
            **self._driven(),
        }
        row = await self._db.transaction(
            lambda tx: insert(tx, "batches", values, returning=BATCH_COLUMNS).fetchall()[0],
            durable=True,
        )
        return batch_from_row(row)

    def _driven(self) -> dict[str, object]:
        """Columns a new batch gets beyond its own fields (its driver)."""
        return {}

    async def adopt(self, batch_id: str) -> bool:
        """Make this yard the batch's driver (one yard drives every batch)."""
        return True

    async def drives(self, batch_id: str) -> bool:
        """Whether this yard is (still) the batch's driver."""
        return True

    async def release(self) -> int:
        """Give up driving this yard's batches (nobody else would take them)."""
        return 0

    async def cancelled_elsewhere(self, batch_id: str) -> bool:
        """Whether the batch was cancelled by another node (one yard's
        cancels reach its driver directly)."""
        return False

    async def batch(self, batch_id: str) -> BatchRecord | None:
        row = await self._db.fetchone(
            f"SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?", (batch_id,)
        )
        return None if row is None else batch_from_row(row)

    async def list_batches(
        self, *, app: str | None, limit: int, before_seq: int | None
    ) -> list[BatchRecord]:
        """Batches newest first (of ``app``; None: all), older than ``before_seq``."""
        clause, params = where_clause({"app = ?": app, "seq < ?": before_seq})
        rows = await self._db.fetchall(
            f"SELECT {BATCH_COLUMNS} FROM batches {clause} ORDER BY seq DESC LIMIT ?",
            (*params, limit),
        )
        return [batch_from_row(row) for row in rows]

    async def unended(self) -> list[BatchRecord]:
        """Batches that have not ended, oldest first (for a restart)."""
        return await self._unended("")

    async def _unended(self, where: str, *params: object) -> list[BatchRecord]:
        rows = await self._db.fetchall(
            f"SELECT {BATCH_COLUMNS} FROM batches WHERE status IN {UNENDED}{where} ORDER BY seq",
            params,
        )
        return [batch_from_row(row) for row in rows]

    async def fail(self, batch_id: str, errors: Sequence[BatchError], *, at: float) -> bool:
        """validating -> failed, with ``errors``."""
        text = _errors_text(errors)
        changed = await self._db.execute(
            f"UPDATE batches SET status = 'failed', failed_at = ?, errors = ?{self._UNDRIVEN} "
            "WHERE id = ? AND status = 'validating'",
            (at, text, batch_id),
            durable=True,
        )
        return changed == 1

    async def start(self, batch_id: str, lines: Sequence[ParsedLine], *, at: float) -> bool:
        """validating -> in_progress, with its lines written (in submission
        order), in one durable transaction. False if it was not validating
        (cancelled meanwhile)."""

        def _start(tx: Tx) -> bool:
            cursor = tx.execute(
                "UPDATE batches SET status = 'in_progress', in_progress_at = ?, total = ? "
                "WHERE id = ? AND status = 'validating'",
                (at, len(lines), batch_id),
            )
            if cursor.rowcount != 1:
                return False
            # Plain tuples all along (see ParsedLines).
            rows = (
                lines.rows
                if isinstance(lines, ParsedLines)
                else [(p.line, p.custom_id, p.model, p.backend, p.url, p.body) for p in lines]
            )
            for first in range(0, len(rows), _INSERT_CHUNK):
                tx.executemany(
                    "INSERT INTO batch_lines (batch_id, idx, line, custom_id, model, backend, "
                    "body) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (batch_id, i, line, custom_id, model, backend, body)
                        for i, (line, custom_id, model, backend, _, body) in enumerate(
                            rows[first : first + _INSERT_CHUNK], first
                        )
                    ],
                )
                # This runs in a worker thread: the event loop's thread gets
                # the GIL now if it waits for it, not after the 5 ms switch
                # interval (50,000 lines held it back ~7 ms at each wake-up).
                time.sleep(0)
            return True

        return await self._db.transaction(_start, durable=True)

    async def mark_cancelling(self, batch_id: str, *, at: float) -> bool:
        """validating or in_progress -> cancelling."""
        changed = await self._db.execute(
            "UPDATE batches SET status = 'cancelling', cancelling_at = ? "
            "WHERE id = ? AND status IN ('validating', 'in_progress')",
            (at, batch_id),
            durable=True,
        )
        return changed == 1

    async def mark_finalizing(self, batch_id: str, *, at: float) -> bool:
        """in_progress -> finalizing (a cancelling batch stays cancelling)."""
        changed = await self._db.execute(
            "UPDATE batches SET status = 'finalizing', finalizing_at = ? "
            "WHERE id = ? AND status = 'in_progress'",
            (at, batch_id),
            durable=True,
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
        only if it has lines), set its counts, forget its lines. One durable
        transaction; False if the batch had already ended."""
        stamp = {
            "completed": "completed_at",
            "expired": "expired_at",
            "cancelled": "cancelled_at",
            "failed": "failed_at",
        }[status]
        stored_errors = _errors_text(errors) if errors else None

        def _finish(tx: Tx) -> bool:
            rows = tx.execute(
                "SELECT outcome, output FROM batch_lines WHERE batch_id = ? ORDER BY line",
                (batch.id,),
            ).fetchall()
            ok = [str(out) for outcome, out in rows if outcome == "ok"]
            bad = [str(out) for outcome, out in rows if outcome != "ok" and out is not None]
            cursor = tx.execute(
                f"UPDATE batches SET status = ?, {stamp} = ?, "
                "finalizing_at = COALESCE(finalizing_at, ?), output_file_id = ?, "
                "error_file_id = ?, completed = ?, failed = ?, "
                f"errors = COALESCE(?, errors){self._UNDRIVEN} "
                f"WHERE id = ? AND status IN {UNENDED}",
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
                    _insert_file(tx, file_id, batch.app, "batch_output", filename, content, at)
            tx.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch.id,))
            return True

        return await self._db.transaction(_finish, durable=True)

    # -- lines ---------------------------------------------------------------

    async def unended_lines(self, batch_id: str, *, after: int, limit: int) -> list[LineRecord]:
        """Up to ``limit`` of a batch's lines that have not ended, after
        submission place ``after`` (-1: from the first), in submission order
        (without bodies): how a driver reads them, a page at a time."""

        def _page(tx: Tx) -> list[LineRecord]:
            rows = tx.execute(
                f"SELECT {LINE_COLUMNS} FROM batch_lines WHERE batch_id = ? AND idx > ? "
                "AND outcome IS NULL ORDER BY idx LIMIT ?",
                (batch_id, after, limit),
            ).fetchall()
            return [line_from_row(row) for row in rows]

        return await self._db.transaction(_page)

    async def unended_job_ids(self, batch_id: str) -> list[str]:
        """The job ids of a batch's lines that are jobs and have not ended, in
        submission order (what a cancel cancels; no read of every line)."""
        rows = await self._db.fetchall(
            "SELECT job_id FROM batch_lines WHERE batch_id = ? AND job_id IS NOT NULL "
            "AND outcome IS NULL ORDER BY idx",
            (batch_id,),
        )
        return [str(row[0]) for row in rows]

    async def unended_per_backend(self, batch_id: str) -> dict[str, int]:
        """How many of a batch's lines have not ended, per backend."""
        rows = await self._db.fetchall(
            "SELECT backend, count(*) FROM batch_lines WHERE batch_id = ? AND outcome IS NULL "
            "GROUP BY backend",
            (batch_id,),
        )
        return {str(backend): int(count) for backend, count in rows}

    async def counts(self, batch_id: str) -> tuple[int, int, int]:
        """(completed, failed, expired) lines of a running batch so far; the
        expired ones are among the failed."""
        row = await self._db.fetchone(
            "SELECT count(*) FILTER (WHERE outcome = 'ok'), "
            "count(*) FILTER (WHERE outcome IN ('error', 'expired')), "
            "count(*) FILTER (WHERE outcome = 'expired') FROM batch_lines WHERE batch_id = ?",
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
        """Make the line a queued job (its request moves from the line to the
        job), durably. None if it already was one or has ended."""

        def _submit(tx: Tx) -> JobRecord | None:
            row = tx.execute(
                "SELECT body FROM batch_lines WHERE batch_id = ? AND idx = ? "
                f"AND job_id IS NULL AND outcome IS NULL{tx.for_update}",
                (line.batch_id, line.idx),
            ).fetchone()
            if row is None or row[0] is None:
                return None
            job = self.jobs.insert_row(
                tx,
                job_id=job_id,
                app=app,
                model=line.model,
                backend=line.backend,
                priority=priority,
                start_by=start_by,
                allow_late=False,
                rerun_safe=rerun_safe,
                created_at=created_at,
                request=StoredRequest(
                    method="POST",
                    path=path,
                    query="",
                    headers=((b"content-type", b"application/json"),),
                    body=bytes(row[0]),
                ),
            )
            tx.execute(
                "UPDATE batch_lines SET job_id = ?, body = NULL WHERE batch_id = ? AND idx = ?",
                (job_id, line.batch_id, line.idx),
            )
            return job

        return await self._db.transaction(_submit, durable=True)

    async def record(self, line: LineRecord, *, outcome: str, output: str) -> bool:
        """Store the line's outcome (``ok``, ``error``, ``expired``) and its
        output- or error-file line, once, durably."""
        changed = await self._db.execute(
            "UPDATE batch_lines SET outcome = ?, output = ?, body = NULL "
            "WHERE batch_id = ? AND idx = ? AND outcome IS NULL",
            (outcome, output, line.batch_id, line.idx),
            durable=True,
        )
        return changed == 1

    async def record_many(self, ended: Sequence[tuple[LineRecord, str, str]]) -> int:
        """:meth:`record` for many lines ((line, outcome, output) each) in one
        durable transaction: a cancelled batch's 50,000 lines took one synced
        write each (20-180 s). Returns how many were recorded now."""
        return await self._db.transaction(
            lambda tx: tx.executemany(
                "UPDATE batch_lines SET outcome = ?, output = ?, body = NULL "
                "WHERE batch_id = ? AND idx = ? AND outcome IS NULL",
                [(outcome, output, line.batch_id, line.idx) for line, outcome, output in ended],
            ),
            durable=True,
        )

    async def service_times(self, backend: str, *, limit: int = 20) -> list[float]:
        """The run times (start to end, seconds) of the latest jobs on
        ``backend`` that succeeded: what a batch line there is expected to take."""
        rows = await self._db.fetchall(
            "SELECT finished_at - started_at FROM jobs WHERE backend = ? AND "
            "started_at IS NOT NULL AND finished_at IS NOT NULL AND error_code IS NULL "
            "AND result_status IS NOT NULL ORDER BY finished_at DESC LIMIT ?",
            (backend, limit),
        )
        times = [float(r[0]) for r in rows if r[0] is not None]
        return [t for t in times if t >= 0]


def _errors_text(errors: Sequence[BatchError]) -> str:
    return json.dumps(
        [{"code": e.code, "message": e.message, "param": e.param, "line": e.line} for e in errors]
    )


def _insert_file(
    tx: Tx,
    file_id: str,
    app: str,
    purpose: str,
    filename: str,
    content: bytes,
    created_at: float,
) -> FileRecord:
    values = {"id": file_id, "app": app, "purpose": purpose, "filename": filename}
    row = insert(
        tx,
        "files",
        {**values, "bytes": len(content), "created_at": created_at},
        returning=FILE_COLUMNS,
    ).fetchall()[0]
    tx.insert_blob("file_contents", {"file_id": file_id}, "body", content)
    return file_from_row(row)
