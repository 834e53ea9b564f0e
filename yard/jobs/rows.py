"""A job's row and its record: how the job stores read a ``jobs`` row into a
:class:`~yard.jobs.records.JobRecord`, and keep headers as text. Both stores
use it: SQLite (:mod:`yard.jobs.store`) and a cluster's PostgreSQL
(:mod:`yard.cluster.jobs`), which select the same :data:`COLUMNS`.

Rules it keeps:

- A row is read field by field: a value that does not convert (an older
  yard's, a damaged disk's) becomes None, with a note on the record that says
  so, so that one bad field never makes the whole job unreadable.
- Headers are kept as JSON ``[[name, value], ...]``, each byte one latin-1
  character, so that any header the client or backend sent comes back
  exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar, cast

from yard.jobs.records import Headers, JobError, JobRecord, Status

__all__ = ["COLUMNS", "dump_headers", "job_record", "load_headers"]

T = TypeVar("T")

COLUMNS = (
    "seq, id, app, model, backend, priority, start_by, allow_late, rerun_safe, rerun_used, "
    "requeued, status, created_at, started_at, finished_at, queued_s, error_code, "
    "error_message, error_status, result_status, result_bytes, result_type, not_before"
)
"""The columns of a :class:`JobRecord`, in the order :func:`job_record` reads them."""
_NAMES = COLUMNS.split(", ")


def dump_headers(headers: Headers) -> str:
    """Headers as the text the stores keep."""
    return json.dumps([[n.decode("latin-1"), v.decode("latin-1")] for n, v in headers])


def load_headers(text: str) -> Headers:
    """Headers back from the text :func:`dump_headers` made."""
    return tuple((str(n).encode("latin-1"), str(v).encode("latin-1")) for n, v in json.loads(text))


class _Fields:
    """Reads one stored row (of :data:`COLUMNS`) field by field: a value that
    does not convert becomes None (or the given fallback) with a note, so that
    one bad field (an older yard's, a damaged disk's) never makes the whole
    job unreadable."""

    def __init__(self, row: tuple[object, ...]) -> None:
        self.row = dict(zip(_NAMES, row, strict=True))
        self.notes: list[str] = []

    def __getitem__(self, name: str) -> Any:
        """The field ``name`` as stored."""
        return self.row[name]

    def get(self, name: str, convert: Callable[[Any], T]) -> T | None:
        """The field ``name`` converted, or None (with a note if it was not
        None but did not convert)."""
        value = self.row[name]
        if value is None:
            return None
        try:
            return convert(value)
        except (TypeError, ValueError, OverflowError):
            self.notes.append(
                f"{name}: the stored value {_short(value)} is unreadable; shown as null"
            )
            return None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def job_record(row: tuple[object, ...]) -> JobRecord:
    """The job in ``row`` (its :data:`COLUMNS`, in order)."""
    f = _Fields(row)
    error = (
        None
        if f["error_code"] is None
        else JobError(
            code=str(f["error_code"]),
            message=str(f["error_message"] or ""),
            status=f.get("error_status", int),
        )
    )
    base_priority = f.get("priority", float)
    if base_priority is None:
        f.notes.append("priority: none stored; the job runs at priority 0")
    return JobRecord(
        seq=int(f["seq"]),
        id=str(f["id"]),
        app=str(f["app"]),
        model=str(f["model"]),
        backend=str(f["backend"]),
        priority=base_priority or 0.0,
        start_by=f.get("start_by", float),
        allow_late=bool(f["allow_late"]),
        rerun_safe=bool(f["rerun_safe"]),
        rerun_used=bool(f["rerun_used"]),
        requeued=bool(f["requeued"]),
        status=cast(Status, str(f["status"])),
        created_at=f.get("created_at", float),
        started_at=f.get("started_at", float),
        finished_at=f.get("finished_at", float),
        queued_s=f.get("queued_s", float),
        error=error,
        result_status=f.get("result_status", int),
        result_bytes=f.get("result_bytes", int),
        result_type=None if f["result_type"] is None else str(f["result_type"]),
        not_before=f.get("not_before", float),
        notes=tuple(f.notes),
    )
