"""Rows of the batch tables as records: the column lists and their decoders.

A decoder unpacks a row in the order of its column list, so the two live
together here; the SQLite store (:mod:`yard.batches.store`) and the
cluster's PostgreSQL one (:mod:`yard.cluster.batches`) both read their
``SELECT``s back through them, and so return the same records.
"""

from __future__ import annotations

import json
from typing import Any, cast

from yard.batches.records import BatchError, BatchRecord, BatchStatus, FileRecord, LineRecord

FILE_COLUMNS = "seq, id, app, purpose, filename, bytes, created_at"
"""The columns of ``files`` that :func:`file_from_row` reads, in its order."""
BATCH_COLUMNS = (
    "seq, id, app, endpoint, input_file_id, completion_window, metadata, priority, "
    "rerun_safe, status, created_at, expires_at, in_progress_at, finalizing_at, "
    "completed_at, failed_at, expired_at, cancelling_at, cancelled_at, errors, "
    "output_file_id, error_file_id, total, completed, failed"
)
"""The columns of ``batches`` that :func:`batch_from_row` reads, in its order."""
_BATCH_NAMES = BATCH_COLUMNS.split(", ")
LINE_COLUMNS = "batch_id, idx, line, custom_id, model, backend, job_id, outcome"
"""The columns of ``batch_lines`` that :func:`line_from_row` reads, in its order."""
UNENDED = "('validating', 'in_progress', 'finalizing', 'cancelling')"
"""The statuses of a batch that has not ended, as an SQL list."""


def _opt(value: object) -> float | None:
    return None if value is None else float(cast(float, value))


def file_from_row(row: tuple[object, ...]) -> FileRecord:
    """A ``files`` row of :data:`FILE_COLUMNS` as a record."""
    seq, file_id, app, purpose, filename, size, created_at = row
    return FileRecord(
        seq=int(cast(int, seq)),
        id=str(file_id),
        app=str(app),
        purpose=str(purpose),
        filename=str(filename),
        bytes=int(cast(int, size)),
        created_at=float(cast(float, created_at)),
    )


def _errors_from_text(text: object) -> tuple[BatchError, ...]:
    if text is None:
        return ()
    return tuple(
        BatchError(
            code=str(e["code"]),
            message=str(e["message"]),
            line=e.get("line"),
            param=e.get("param"),
        )
        for e in json.loads(str(text))
    )


def batch_from_row(row: tuple[object, ...]) -> BatchRecord:
    """A ``batches`` row of :data:`BATCH_COLUMNS` as a record."""
    c: dict[str, Any] = dict(zip(_BATCH_NAMES, row, strict=True))
    return BatchRecord(
        seq=int(c["seq"]),
        id=str(c["id"]),
        app=str(c["app"]),
        endpoint=str(c["endpoint"]),
        input_file_id=str(c["input_file_id"]),
        completion_window=str(c["completion_window"]),
        metadata=None if c["metadata"] is None else dict(json.loads(str(c["metadata"]))),
        priority=float(c["priority"]),
        rerun_safe=bool(c["rerun_safe"]),
        status=cast(BatchStatus, str(c["status"])),
        created_at=float(c["created_at"]),
        expires_at=float(c["expires_at"]),
        in_progress_at=_opt(c["in_progress_at"]),
        finalizing_at=_opt(c["finalizing_at"]),
        completed_at=_opt(c["completed_at"]),
        failed_at=_opt(c["failed_at"]),
        expired_at=_opt(c["expired_at"]),
        cancelling_at=_opt(c["cancelling_at"]),
        cancelled_at=_opt(c["cancelled_at"]),
        errors=_errors_from_text(c["errors"]),
        output_file_id=None if c["output_file_id"] is None else str(c["output_file_id"]),
        error_file_id=None if c["error_file_id"] is None else str(c["error_file_id"]),
        total=int(c["total"]),
        completed=int(c["completed"]),
        failed=int(c["failed"]),
    )


def line_from_row(row: tuple[object, ...]) -> LineRecord:
    """A ``batch_lines`` row of :data:`LINE_COLUMNS` as a record."""
    batch_id, idx, line, custom_id, model, backend, job_id, outcome = row
    return LineRecord(
        batch_id=str(batch_id),
        idx=int(cast(int, idx)),
        line=int(cast(int, line)),
        custom_id=str(custom_id),
        model=str(model),
        backend=str(backend),
        job_id=None if job_id is None else str(job_id),
        outcome=None if outcome is None else str(outcome),
    )
