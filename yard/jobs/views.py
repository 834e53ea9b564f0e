"""A job as JSON: what ``GET /v1/jobs/ID`` answers and ``GET /v1/jobs`` lists.

Rules it keeps:

- Showing a job never fails on one field. A stored value that cannot be shown
  (a time no RFC 3339 UTC string can name, an infinite number, a field the
  store could not read) is ``null`` in the JSON and explained in the job's
  ``notes``.
- A job's ``status`` says how it ended, also after its result is gone: the
  store marks such a job ``expired`` (its result no longer counts against the
  app's quota), but to a client that word means "it did not run in time", so
  it is shown ``succeeded``, ``failed`` or ``cancelled`` as it ended, with
  ``result_gone`` saying where the answer went (a batch's output file, a
  ``DELETE`` of the result, or ``[jobs] result_ttl_s``).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from yard.core.views import QueuedView
from yard.jobs.store import JobRecord, Status

_BATCH_LINE = re.compile(r"job_([0-9a-f]{32})_[0-9]+")
"""The id of a batch line's job (``yard.batches.driver``): job_<batch hex>_<idx>."""


def ended_as(job: JobRecord) -> Status:
    """How a job ended, also once its result is gone (stored ``expired``)."""
    if job.status != "expired":
        return job.status
    if job.error is None:
        return "succeeded"
    return "cancelled" if job.error.code == "cancelled" else "failed"


def result_gone(job: JobRecord, *, now_wall: float, result_ttl_s: float) -> str | None:
    """Where the result of a job stored ``expired`` went, in words; None if
    it has not gone."""
    if job.status != "expired":
        return None
    batch = _BATCH_LINE.fullmatch(job.id)
    if batch is not None:
        return (
            f"its answer is a line of batch batch_{batch.group(1)}'s output or error file "
            "(GET /v1/batches/ID, then its output_file_id)"
        )
    if job.finished_at is not None and now_wall >= job.finished_at + result_ttl_s - 1.0:
        return f"its result was deleted {_span(result_ttl_s)} after it ended ([jobs] result_ttl_s)"
    return "its result was deleted on request (DELETE /v1/jobs/ID/result)"


def _span(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def rfc3339(epoch: float | None) -> str | None:
    """``1767225600.5`` -> ``"2026-01-01T00:00:00.500Z"``; None for None and
    for a time outside what RFC 3339 can write (years 1 to 9999, UTC)."""
    if epoch is None or not math.isfinite(epoch):
        return None
    try:
        moment = datetime.fromtimestamp(epoch, UTC)
    except (OverflowError, ValueError, OSError):
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_json(
    job: JobRecord,
    *,
    status: str,
    view: QueuedView | None,
    now_wall: float,
    now_engine: float,
    result_ttl_s: float,
) -> dict[str, object]:
    """The job's JSON.

    status: the status to show (a job the core requeued after a self-caused
        out-of-memory is ``running`` on disk but ``queued`` to its client).
    view: the scheduler's view of it while it is queued (place, reason,
        estimated start on the engine clock ``now_engine``), else None.
    now_wall: the wall clock now, to show engine times as RFC 3339.
    result_ttl_s: how long a finished job keeps its result (``expires_at``).
    """
    notes = list(job.notes)

    def when(name: str, epoch: float | None) -> str | None:
        text = rfc3339(epoch)
        if text is None and epoch is not None:
            notes.append(f"{name}: {epoch!r} is not a time RFC 3339 can write; shown as null")
        return text

    def number(name: str, value: float | None) -> float | None:
        if value is None or math.isfinite(value):
            return value
        notes.append(f"{name}: {value!r} is not a finite number; shown as null")
        return None

    queued_s = number("queued_s", job.queued_s)
    estimated = None if view is None else view.estimated_start
    return {
        "id": job.id,
        "object": "job",
        "app": job.app,
        "model": job.model,
        "backend": job.backend,
        "status": ended_as(job) if status == "expired" else status,
        "created_at": when("created_at", job.created_at),
        "started_at": when("started_at", job.started_at),
        "finished_at": when("finished_at", job.finished_at),
        "expires_at": (
            rfc3339(job.finished_at + result_ttl_s)
            if job.finished_at is not None and job.status != "expired"
            else None
        ),
        "priority": number("priority", job.priority),
        "effective_priority": None
        if view is None
        else number("effective_priority", view.effective_priority),
        "deadline": when("deadline", job.start_by),
        "not_before": when("not_before", job.not_before),
        "allow_late": job.allow_late,
        "rerun_safe": job.rerun_safe,
        "requeued": job.requeued,
        "position": None if view is None else view.position,
        "reason": (
            view.reason
            if view is not None
            else "just handed in: the scheduler is placing it"
            if status == "queued"
            else None
        ),
        "estimated_start": (
            None if estimated is None else rfc3339(now_wall + (estimated - now_engine))
        ),
        "queued_ms": None if queued_s is None else round(queued_s * 1000),
        "error": (
            None
            if job.error is None
            else {"code": job.error.code, "message": job.error.message, "status": job.error.status}
        ),
        "result": (
            None
            if job.result_status is None or job.status == "expired"
            else {
                "status": job.result_status,
                "content_type": job.result_type,
                "bytes": job.result_bytes,
                "url": f"/v1/jobs/{job.id}/result",
            }
        ),
        "result_gone": result_gone(job, now_wall=now_wall, result_ttl_s=result_ttl_s),
        "notes": notes,
    }
