"""The Batch API's JSON: a file, a batch, and a line of the output or error file.

Times are whole epoch seconds, as OpenAI writes them.
"""

from __future__ import annotations

import json

from yard.batches.records import BatchRecord, FileRecord, LineRecord
from yard.jobs.store import JobRecord, StoredResult

EXPIRED_CODES = frozenset({"deadline_missed", "deadline_infeasible"})
"""A line's job ended with one of these: it could not start inside the window."""


def _epoch(value: float | None) -> int | None:
    return None if value is None else int(value)


def file_json(record: FileRecord) -> dict[str, object]:
    """A file object (``GET /v1/files/ID``)."""
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": int(record.created_at),
        "expires_at": None,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "status_details": None,
    }


def batch_json(batch: BatchRecord, *, counts: tuple[int, int] | None = None) -> dict[str, object]:
    """A batch object (``GET /v1/batches/ID``).

    counts: (completed, failed) so far, for a batch that has not ended (an
    ended one has them stored).
    """
    completed, failed = counts if counts is not None else (batch.completed, batch.failed)
    errors = None
    if batch.errors:
        errors = {
            "object": "list",
            "data": [
                {"code": e.code, "message": e.message, "param": e.param, "line": e.line}
                for e in batch.errors
            ],
        }
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at),
        "in_progress_at": _epoch(batch.in_progress_at),
        "expires_at": int(batch.expires_at),
        "finalizing_at": _epoch(batch.finalizing_at),
        "completed_at": _epoch(batch.completed_at),
        "failed_at": _epoch(batch.failed_at),
        "expired_at": _epoch(batch.expired_at),
        "cancelling_at": _epoch(batch.cancelling_at),
        "cancelled_at": _epoch(batch.cancelled_at),
        "request_counts": {"total": batch.total, "completed": completed, "failed": failed},
        "metadata": batch.metadata,
    }


def request_id(line: LineRecord) -> str:
    """The output line's ``id`` (``batch_req_...``)."""
    return f"batch_req_{line.batch_id.removeprefix('batch_')}_{line.idx}"


def error_line(line: LineRecord, code: str, message: str) -> str:
    """An error-file line for a request that got no answer from a backend."""
    # What json.dumps of the object writes, made from its strings alone:
    # 3-4 times faster, and a cancelled batch writes 50,000 of these.
    return (
        f'{{"id": {json.dumps(request_id(line))}, "custom_id": {json.dumps(line.custom_id)}, '
        f'"response": null, "error": {{"code": {json.dumps(code)}, '
        f'"message": {json.dumps(message)}}}}}'
    )


EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
CANCELLED_MESSAGE = "This request was not executed because the batch was cancelled."


def job_line(
    line: LineRecord, job: JobRecord, result: StoredResult | None, *, cancelling: bool
) -> tuple[str, str]:
    """The outcome of a line whose job has ended: (``ok``, ``error`` or
    ``expired``; its output- or error-file line).

    A 2xx answer goes to the output file; any other answer of the backend to
    the error file, with its ``response`` and ``error: null`` (as OpenAI does);
    a job that got no answer to the error file with ``error: {code, message}``
    (``batch_expired``, ``batch_cancelled``, ``interrupted``, ...).
    """
    if result is not None:

        def text(body: object) -> str:
            return json.dumps(
                {
                    "id": request_id(line),
                    "custom_id": line.custom_id,
                    "response": {"status_code": result.status, "request_id": job.id, "body": body},
                    "error": None,
                }
            )

        outcome = "ok" if 200 <= result.status < 300 else "error"
        try:
            return outcome, text(json.loads(result.body))
        except (ValueError, RecursionError):
            # Not JSON, or nested deeper than Python reads or writes: the
            # answer goes in as text, as any other body that is not JSON.
            return outcome, text(result.body.decode("utf-8", "replace"))
    error = job.error
    if job.status == "cancelled":
        if cancelling:
            return "error", error_line(line, "batch_cancelled", CANCELLED_MESSAGE)
        return "error", error_line(line, "cancelled", "the request's job was cancelled")
    if error is not None and error.code in EXPIRED_CODES:
        return "expired", error_line(line, "batch_expired", EXPIRED_MESSAGE)
    if error is None:
        # Ended and its result already deleted: nothing can be said of it.
        message = "the request's result has been deleted ([jobs] result_ttl_s)"
        return "error", error_line(line, "result_expired", message)
    return "error", error_line(line, error.code, error.message)
