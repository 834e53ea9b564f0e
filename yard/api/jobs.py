"""The jobs API: ``/v1/jobs`` (mounted by :func:`register` with the job
service it serves).

- ``GET /v1/jobs/ID[?wait=SECONDS]``: the job (status, place in the queue,
  why it waits, estimated start, error); ``wait`` long-polls until it ends.
- ``GET /v1/jobs/ID/result[?wait=SECONDS]``: the backend's answer exactly as
  it was sent (status, headers, bytes). A job that failed before the backend
  answered gets the error a synchronous request would have got.
- ``DELETE /v1/jobs/ID``: cancel (leave the queue, or cancel the upstream call).
- ``DELETE /v1/jobs/ID/result``: delete an ended job's result now (the job
  becomes ``expired``), freeing its place in the app's quota.
- ``GET /v1/jobs?status=queued,running&limit=20&after=ID``: the caller's
  jobs, newest first.

A job belongs to the app whose key handed it in; to every other app it does
not exist (404). The admin key sees every job; so does a request without a
key from this machine while no admin key is configured (the admin API's rule).
"""

from __future__ import annotations

import math
import re

import trio
from quart import Blueprint, Quart, Response, current_app, request
from werkzeug.datastructures import Headers

from yard.api.errors import answer, quoted
from yard.api.keys import KeyCheck, is_loopback
from yard.api.served import Served, page
from yard.errors import Rejected
from yard.h1.upstream import HOP_BY_HOP
from yard.jobs.service import JobFinished, JobNotFinished, JobNotFound, Jobs
from yard.jobs.store import STATUSES, JobRecord, Status

blueprint = Blueprint("jobs", __name__)
"""Mounted by :func:`register` with ``url_prefix="/v1/jobs"``."""

_MAX_LIMIT = 100
_LIMIT = re.compile(r"[0-9]{1,4}")
# Set again by Quart or meaningless for a stored answer.
_RESULT_DROPPED = HOP_BY_HOP | {b"content-length", b"date", b"server"}


_KEY = "yard.jobs"


def register(app: Quart, jobs: Jobs | None, keys: KeyCheck) -> None:
    """Mount the jobs API on ``app`` at ``/v1/jobs``, serving ``jobs`` (None:
    this yard runs without the job service, and every call answers 501)."""
    app.extensions[_KEY] = Served(jobs, keys)
    app.register_blueprint(blueprint, url_prefix="/v1/jobs")


def _caller() -> tuple[Jobs, str | None]:
    """The job service and the caller's app (None: the admin, who sees all)."""
    served: Served[Jobs] = current_app.extensions[_KEY]
    header = request.headers.get("authorization")
    if (
        served.keys.config.server.admin_key is None
        and header is None
        and is_loopback(request.remote_addr)
    ):
        # The same rule as the admin API: with no admin key, a client on
        # this machine is the operator (yard jobs list on the demo).
        app = None
    else:
        # The key before the service: a wrong one counts as a guess even
        # where the service is off.
        app = served.keys.caller(header, request.remote_addr)
    jobs = served.service
    if jobs is None:
        raise Rejected(
            501, "jobs_unavailable", "this yard runs without the job service; no jobs exist"
        )
    return jobs, None if app is None else app.name


def _wait_arg(jobs: Jobs) -> float:
    text = request.args.get("wait")
    if text is None:
        return 0.0
    try:
        wait = float(text)
    except ValueError:
        wait = math.nan
    if not math.isfinite(wait) or wait < 0:
        raise Rejected(
            400, "invalid_wait", f"wait must be a number of seconds >= 0, got {quoted(text)}"
        )
    return min(wait, jobs.config.max_wait_s)


async def _job_after_wait(jobs: Jobs, job_id: str, app: str | None) -> JobRecord:
    job = await jobs.get(job_id, app=app)
    wait = _wait_arg(jobs)
    if wait > 0 and not job.finished:
        with trio.move_on_after(wait):
            job = await jobs.wait_ended(job_id, app=app)
        if not job.finished:
            job = await jobs.get(job_id, app=app)
    return job


blueprint.register_error_handler(Rejected, answer)


@blueprint.errorhandler(JobNotFound)
async def _not_found(error: JobNotFound) -> Response:
    return await answer(
        Rejected(404, "job_not_found", f"no job {quoted(error.args[0])} for this API key")
    )


@blueprint.errorhandler(JobNotFinished)
async def _not_finished(error: JobNotFinished) -> Response:
    job = error.job
    return await answer(
        Rejected(
            409,
            "job_not_finished",
            f"job {job.id} is {job.status}; it has no result to delete yet "
            f"(DELETE /v1/jobs/{job.id} cancels it)",
        )
    )


@blueprint.errorhandler(JobFinished)
async def _finished(error: JobFinished) -> Response:
    return await answer(Rejected(409, "job_finished", str(error)))


@blueprint.get("", strict_slashes=False)
async def list_jobs() -> dict[str, object]:
    jobs, app = _caller()
    statuses: list[Status] = []
    for text in request.args.getlist("status"):
        for word in text.split(","):
            word = word.strip()
            if not word:
                continue
            if word not in STATUSES:
                raise Rejected(
                    400,
                    "invalid_status",
                    f"status {quoted(word)} is not one of {', '.join(STATUSES)}",
                )
            statuses.append(word)
    limit_text = request.args.get("limit", "20")
    # ASCII digits only, and few: int() refuses 4,300 digits and str.isdigit
    # accepts a superscript two.
    if not _LIMIT.fullmatch(limit_text) or not 1 <= int(limit_text) <= _MAX_LIMIT:
        raise Rejected(400, "invalid_limit", f"limit must be a whole number from 1 to {_MAX_LIMIT}")
    after = request.args.get("after") or None
    try:
        found, has_more = await jobs.list_jobs(
            app=app, statuses=statuses, limit=int(limit_text), after=after
        )
    except JobNotFound:
        raise Rejected(
            400, "invalid_cursor", f"after={quoted(after or '')} names no job of yours"
        ) from None
    return page([jobs.describe(job) for job in found], has_more=has_more)


@blueprint.get("/<job_id>")
async def get_job(job_id: str) -> dict[str, object]:
    jobs, app = _caller()
    return jobs.describe(await _job_after_wait(jobs, job_id, app))


@blueprint.delete("/<job_id>")
async def cancel_job(job_id: str) -> dict[str, object]:
    jobs, app = _caller()
    return jobs.describe(await jobs.cancel(job_id, app=app))


@blueprint.delete("/<job_id>/result")
async def delete_result(job_id: str) -> dict[str, object]:
    jobs, app = _caller()
    return jobs.describe(await jobs.delete_result(job_id, app=app))


@blueprint.get("/<job_id>/result")
async def job_result(job_id: str) -> Response:
    jobs, app = _caller()
    job = await _job_after_wait(jobs, job_id, app)
    if not job.finished:
        raise Rejected(
            409,
            "job_not_finished",
            f"job {job.id} is {job.status}; GET /v1/jobs/{job.id}/result?wait=60 waits for it",
        )
    if job.status == "expired":
        shown = jobs.describe(job)
        message = f"job {job.id} {shown['status']}; {shown['result_gone']}"
        raise Rejected(410, "job_expired", message)
    _, result = await jobs.result(job_id, app=app)
    if result is None:
        error = job.error
        if error is None or job.status == "cancelled":
            raise Rejected(409, "cancelled", f"job {job.id} was cancelled; it has no result")
        status = error.status if error.status is not None and error.status >= 400 else 500
        raise Rejected(status, error.code, error.message)
    headers = [
        (n.decode("latin-1"), v.decode("latin-1"))
        for n, v in result.headers
        if n.lower() not in _RESULT_DROPPED
    ]
    headers.append(("x-yard-job-id", job.id))
    if job.queued_s is not None:
        headers.append(("x-yard-queue-ms", str(round(job.queued_s * 1000))))
    response = Response(result.body, status=result.status, headers=Headers(headers))
    if result.content_type is None:
        # Exactly as the backend sent it: no content type, not Quart's default.
        del response.headers["content-type"]
    return response
