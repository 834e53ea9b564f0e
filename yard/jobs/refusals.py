"""What a client is told when the job service does not take its job.

Each refusal of :meth:`yard.jobs.service.Jobs.submit` is a
:class:`~yard.errors.Rejected` (the OpenAI error shape) with a stable
``code``, the HTTP status, and a message that says what to do about it,
naming the ``[jobs]`` setting that decided. Nothing is stored when one is
raised.
"""

from __future__ import annotations

from yard.errors import Rejected
from yard.jobs.records import QuotaExceeded

__all__ = [
    "database_unavailable",
    "deadline_out_of_range",
    "not_running",
    "over_quota",
    "too_large",
]

RETRY_AFTER_S = 2.0
"""When to try again while the database is lost or busy."""


def too_large(size: int, limit: int) -> Rejected:
    """413 ``job_too_large``: a body of ``size`` bytes, over ``[jobs]
    max_request_bytes`` (``limit``)."""
    return Rejected(
        status=413,
        code="job_too_large",
        message=f"the request body is {size} bytes; jobs store at most "
        f"{limit} bytes ([jobs] max_request_bytes)",
    )


def not_running() -> Rejected:
    """503 ``jobs_unavailable``: the service is starting or stopping."""
    return Rejected(
        status=503,
        code="jobs_unavailable",
        message="the job service is not running (yard is starting or stopping); try again shortly",
        retry_after_s=1.0,
    )


def database_unavailable(exc: Exception) -> Rejected:
    """503 ``database_unavailable``: the database (a cluster's PostgreSQL)
    is lost or busy now (``exc``): nothing was stored."""
    return Rejected(
        status=503,
        code="database_unavailable",
        message=f"yard cannot reach its job database now ({exc}); nothing was stored: "
        "hand the job in again shortly",
        retry_after_s=RETRY_AFTER_S,
    )


def deadline_out_of_range() -> Rejected:
    """400 ``invalid_deadline``: the deadline has no date a person can read."""
    return Rejected(
        status=400,
        code="invalid_deadline",
        message="the deadline is out of range: it must fall between the years 0001 and 9999 (UTC)",
    )


def over_quota(app: str, exc: QuotaExceeded, *, now_wall: float, result_ttl_s: float) -> Rejected:
    """429 ``too_many_jobs`` or 507 ``job_storage_full``: the job would take
    ``app`` past its quota (``exc``). Says how to free room, and when the
    app's oldest result expires (``Retry-After``), if it has one.

    now_wall: the wall-clock time now. result_ttl_s: ``[jobs] result_ttl_s``.
    """
    usage, quota = exc.usage, exc.quota
    free = (
        "Fetch the results you need and delete them (DELETE /v1/jobs/ID/result), cancel "
        "queued jobs you no longer need (DELETE /v1/jobs/ID), or wait until results "
        f"expire ([jobs] result_ttl_s = {result_ttl_s:g} s after each ends)"
    )
    retry = None
    if usage.oldest_finished_at is not None:
        retry = max(1.0, usage.oldest_finished_at + result_ttl_s - now_wall)
    if usage.jobs >= quota.max_jobs:
        return Rejected(
            status=429,
            code="too_many_jobs",
            message=f"app {app!r} keeps {usage.jobs} jobs (queued, running, or ended with "
            f"a result not yet expired), the most [jobs] max_jobs_per_app = "
            f"{quota.max_jobs} allows. {free}.",
            retry_after_s=retry,
        )
    return Rejected(
        status=507,
        code="job_storage_full",
        message=f"app {app!r} keeps {usage.bytes} bytes of job requests and results; "
        f"this request's {exc.size} bytes would go past [jobs] max_stored_bytes_per_app "
        f"= {quota.max_bytes}. {free}.",
        retry_after_s=retry,
    )
