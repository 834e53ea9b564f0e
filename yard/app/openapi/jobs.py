"""The jobs API (``/v1/jobs``, :mod:`yard.jobs`): a request handed in with
``Prefer: respond-async``, its status and its result."""

from __future__ import annotations

from yard.app.openapi.common import (
    AFTER,
    Schema,
    error_response,
    json_response,
    nullable,
    op,
    page_of,
    path_param,
    query,
    ref,
    service_errors,
)

JOB_STATUSES = ["queued", "running", "succeeded", "failed", "cancelled", "expired"]

SCHEMAS: dict[str, Schema] = {
    "JobError": {
        "type": "object",
        "required": ["code", "message", "status"],
        "properties": {
            "code": {"type": "string"},
            "message": {"type": "string"},
            "status": {"type": "integer"},
        },
    },
    "JobResultInfo": {
        "type": "object",
        "required": ["status", "content_type", "bytes", "url"],
        "properties": {
            "status": {"type": "integer", "description": "The backend's HTTP status."},
            "content_type": {"type": nullable("string")},
            "bytes": {"type": nullable("integer")},
            "url": {"type": "string", "description": "GET it for the answer itself."},
        },
    },
    "Job": {
        "description": "A request handed in with `Prefer: respond-async`. Times are RFC 3339 "
        "(UTC), null when not (yet) known.",
        "type": "object",
        "required": ["id", "object", "app", "backend", "status", "created_at", "priority"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "job"},
            "app": {"type": "string"},
            "model": {"type": nullable("string")},
            "backend": {"type": "string"},
            "status": {"enum": JOB_STATUSES},
            "created_at": {"type": nullable("string")},
            "started_at": {"type": nullable("string")},
            "finished_at": {"type": nullable("string")},
            "expires_at": {"type": nullable("string")},
            "priority": {"type": "number"},
            "effective_priority": {"type": nullable("number")},
            "deadline": {"type": nullable("string")},
            "allow_late": {"type": "boolean"},
            "rerun_safe": {"type": "boolean"},
            "requeued": {"type": "boolean"},
            "position": {"type": nullable("integer")},
            "reason": {"type": nullable("string"), "description": "Why it still waits."},
            "estimated_start": {"type": nullable("string")},
            "queued_ms": {"type": nullable("integer")},
            "error": {"anyOf": [ref("JobError"), {"type": "null"}]},
            "result": {"anyOf": [ref("JobResultInfo"), {"type": "null"}]},
            "result_gone": {
                "type": nullable("string"),
                "description": "Where the result went once it is deleted (a batch's output "
                "file, a DELETE, [jobs] result_ttl_s); the status still says how the job ended.",
            },
        },
    },
    "JobList": page_of("Job"),
}

_WAIT = query("wait", "Seconds to wait for the job to end (long poll), at most jobs.max_wait_s.")
_JOB_ID = path_param("job_id", "The job's id (from the 202's `Location`).")
_JOB_ERRORS = {
    **service_errors("`jobs_unavailable`: this yard runs without the job service."),
    "404": error_response("`job_not_found`: no such job for this key."),
}


def paths() -> Schema:
    """``/v1/jobs`` and below."""
    return {
        "/v1/jobs": {
            "get": op(
                "The caller's jobs, newest first (the admin key sees every app's)",
                {
                    "200": json_response(ref("JobList"), "A page of jobs."),
                    "400": error_response("`invalid_status`, `invalid_limit`, `invalid_cursor`."),
                    **_JOB_ERRORS,
                },
                parameters=[
                    query("status", "Comma-separated: " + ", ".join(JOB_STATUSES) + "."),
                    query("limit", "1 to 100 (default 20)."),
                    AFTER,
                ],
            )
        },
        "/v1/jobs/{job_id}": {
            "get": op(
                "A job: status, place in the queue, why it waits, estimated start",
                {
                    "200": json_response(ref("Job"), "The job."),
                    "400": error_response("`invalid_wait`."),
                    **_JOB_ERRORS,
                },
                parameters=[_JOB_ID, _WAIT],
            ),
            "delete": op(
                "Cancel a job (leave the queue, or cancel the backend call)",
                {
                    "200": json_response(ref("Job"), "The job, cancelled."),
                    "409": error_response("`job_finished`: it had already ended."),
                    **_JOB_ERRORS,
                },
                parameters=[_JOB_ID],
            ),
        },
        "/v1/jobs/{job_id}/result": {
            "get": op(
                "The job's answer, exactly as the backend sent it",
                {
                    "200": {"description": "The backend's answer (its status, headers, bytes)."},
                    "400": error_response("`invalid_wait`."),
                    "409": error_response(
                        "`job_not_finished`, or `cancelled`: there is no result."
                    ),
                    "410": error_response("`job_expired`: the result was deleted."),
                    **_JOB_ERRORS,
                    "default": {
                        "description": "A job that failed before the backend answered "
                        "gets the error a synchronous request would have got.",
                    },
                },
                parameters=[_JOB_ID, _WAIT],
            ),
            "delete": op(
                "Delete a finished job's result (frees its room in the app's quota)",
                {
                    "200": json_response(ref("Job"), "The job, its result gone."),
                    "409": error_response("`job_not_finished`: cancel it with DELETE /v1/jobs/ID."),
                    **_JOB_ERRORS,
                },
                parameters=[_JOB_ID],
            ),
        },
    }
