"""yard's own HTTP API as an OpenAPI 3.1 document, served at ``GET /openapi.json``.

What it covers, and how far:

- yard's own routes in full: ``/healthz``, the jobs API (``/v1/jobs``),
  ``/v1/models``, the admin API (``/admin/...``), ``/metrics``, the dashboard
  and this document; every JSON answer has a schema (objects stay open to
  new fields, so that adding one is not a breaking change);
- the routes yard proxies (the OpenAI-compatible ``/v1/*`` and
  ``/backends/NAME/PATH``) by their contract only: what yard reads (the
  ``model`` field, the ``X-Yard-*`` headers, ``Prefer: respond-async``) and
  yard's own answers (202 for a job, the error shape and its codes). The
  backend's answer passes through unchanged, so its schema is the backend's.

``tests/http/test_openapi.py`` keeps the document true: every route the
control plane and the gateway serve is here and every path here is served,
answers of a running yard validate against it, and a schemathesis run over it
gets no 500.
"""

from __future__ import annotations

import json
from typing import Any

from quart import Quart, Response

from yard import __version__

Schema = dict[str, Any]

OPENAI_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/images/generations",
    "/v1/audio/speech",
    "/v1/audio/transcriptions",
)
"""The OpenAI-compatible routes yard routes by their ``model`` field (any
other ``/v1/*`` path but ``/v1/models`` and ``/v1/jobs`` is routed the same way)."""

PROXY_METHODS = ("get", "post", "put", "patch", "delete")
"""Methods documented for ``/backends/{backend}/{path}`` (any method is passed on)."""

ERROR_CODES = (
    "missing_api_key",
    "invalid_api_key",
    "invalid_admin_key",
    "admin_loopback_only",
    "admin_header_required",
    "model_required",
    "model_not_found",
    "backend_not_found",
    "unknown_action",
    "invalid_json",
    "invalid_header",
    "invalid_priority",
    "invalid_deadline",
    "invalid_limit",
    "invalid_status",
    "invalid_cursor",
    "invalid_wait",
    "body_too_large",
    "job_not_found",
    "job_finished",
    "job_not_finished",
    "job_expired",
    "job_too_large",
    "too_many_jobs",
    "app_queue_full",
    "job_storage_full",
    "result_too_large",
    "jobs_unavailable",
    "deadline_infeasible",
    "deadline_missed",
    "does_not_fit",
    "queue_full",
    "backend_failed",
    "cancelled",
    "shutting_down",
    "not_found",
    "method_not_allowed",
    "malformed_request",
    "request_timeout",
    "request_head_too_large",
    "unsupported_transfer_coding",
    "http_version_not_supported",
    "too_many_connections",
    "host_not_allowed",
    "cross_origin_refused",
    "too_many_failed_logins",
)
"""Codes yard's own errors carry (the list grows; a client must accept others)."""


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(kind: str | list[str]) -> list[str]:
    return [*([kind] if isinstance(kind, str) else kind), "null"]


def _json(schema: Schema, description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> Schema:
    return _json(_ref("Error"), description)


def _text(media: str, description: str) -> Schema:
    return {"description": description, "content": {media: {"schema": {"type": "string"}}}}


_JOB_STATUSES = ["queued", "running", "succeeded", "failed", "cancelled", "expired"]

_SCHEMAS: dict[str, Schema] = {
    "Error": {
        "description": "Every error yard itself answers (OpenAI's error shape). A backend's "
        "own 4xx/5xx passes through unchanged instead.",
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "code"],
                "properties": {
                    "message": {
                        "type": "string",
                        "description": "What happened and what to do.",
                    },
                    "type": {
                        "type": "string",
                        "description": "OpenAI's error type for the status "
                        "(invalid_request_error, authentication_error, ...).",
                    },
                    "code": {
                        "type": "string",
                        "description": "Stable, for programs: " + ", ".join(ERROR_CODES) + ".",
                        "examples": list(ERROR_CODES),
                    },
                    "param": {"type": ["string", "null"]},
                },
            }
        },
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"const": "ok"}},
    },
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by", "backend", "state"],
        "properties": {
            "id": {"type": "string", "description": "The name apps send in `model`."},
            "object": {"const": "model"},
            "created": {"type": "integer", "description": "When yard started (epoch)."},
            "owned_by": {"type": "string"},
            "backend": {"type": "string", "description": "The backend that serves it."},
            "state": {
                "type": "string",
                "description": "The backend's state: stopped, starting, ready, busy, ...",
            },
            "context": {
                "type": _nullable("integer"),
                "description": "The context size the running backend was started with, "
                "chosen within its configured context range (null: not running, or no range).",
            },
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ref("Model")},
        },
    },
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
            "content_type": {"type": _nullable("string")},
            "bytes": {"type": _nullable("integer")},
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
            "model": {"type": _nullable("string")},
            "backend": {"type": "string"},
            "status": {"enum": _JOB_STATUSES},
            "created_at": {"type": _nullable("string")},
            "started_at": {"type": _nullable("string")},
            "finished_at": {"type": _nullable("string")},
            "expires_at": {"type": _nullable("string")},
            "priority": {"type": "number"},
            "effective_priority": {"type": _nullable("number")},
            "deadline": {"type": _nullable("string")},
            "allow_late": {"type": "boolean"},
            "rerun_safe": {"type": "boolean"},
            "requeued": {"type": "boolean"},
            "position": {"type": _nullable("integer")},
            "reason": {"type": _nullable("string"), "description": "Why it still waits."},
            "estimated_start": {"type": _nullable("string")},
            "queued_ms": {"type": _nullable("integer")},
            "error": {"anyOf": [_ref("JobError"), {"type": "null"}]},
            "result": {"anyOf": [_ref("JobResultInfo"), {"type": "null"}]},
        },
    },
    "JobList": {
        "type": "object",
        "required": ["object", "data", "first_id", "last_id", "has_more"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ref("Job")},
            "first_id": {"type": _nullable("string")},
            "last_id": {"type": _nullable("string")},
            "has_more": {"type": "boolean"},
        },
    },
    "Status": {
        "description": "Everything the dashboard shows (`yard status` prints the same).",
        "type": "object",
        "required": [
            "version",
            "now",
            "wall_time",
            "started_at",
            "host_only",
            "devices",
            "backends",
            "queue",
            "decisions",
            "failures",
            "profiles",
            "statistics",
        ],
        "properties": {
            "version": {"type": "string"},
            "now": {"type": "number", "description": "The engine's monotonic clock."},
            "wall_time": {"type": "number"},
            "started_at": {"type": "number"},
            "uptime_s": {"type": _nullable("number")},
            "host_only": {"type": "boolean"},
            "devices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "kind", "total_bytes", "free_bytes", "backends"],
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string"},
                        "total_bytes": {"type": "integer"},
                        "free_bytes": {"type": "integer"},
                        "backends": {"type": "array", "items": {"type": "object"}},
                    },
                },
            },
            "backends": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "state", "models", "inflight", "queued", "slots"],
                    "properties": {
                        "name": {"type": "string"},
                        "state": {"type": "string"},
                        "models": {"type": "array", "items": {"type": "string"}},
                        "inflight": {"type": "integer"},
                        "queued": {"type": "integer"},
                        "slots": {"type": "integer"},
                        "pinned": {"type": "boolean"},
                        "context": {"type": _nullable("integer")},
                        "reason": {"type": _nullable("string")},
                    },
                },
            },
            "queue": {
                "type": "object",
                "required": ["length", "items"],
                "properties": {
                    "length": {"type": "integer"},
                    "items": {"type": "array", "items": {"type": "object"}},
                },
            },
            "decisions": {"type": "array", "items": {"type": "object"}},
            "failures": {"type": "array", "items": {"type": "object"}},
            "profiles": {"type": "array", "items": {"type": "object"}},
            "statistics": {"type": "object"},
            "apps": {
                "type": "array",
                "description": "Each app's limits, requests waiting and served now, and "
                "refusals by code.",
                "items": {
                    "type": "object",
                    "required": ["name", "queued", "inflight", "refused"],
                    "properties": {
                        "name": {"type": "string"},
                        "models": {"type": _nullable("array"), "items": {"type": "string"}},
                        "max_queued": {"type": _nullable("integer")},
                        "max_concurrent": {"type": _nullable("integer")},
                        "weight": {"type": "number"},
                        "queued": {"type": "integer"},
                        "inflight": {"type": "integer"},
                        "refused": {
                            "type": "object",
                            "additionalProperties": {"type": "integer"},
                        },
                    },
                },
            },
        },
    },
    "BackendAction": {
        "type": "object",
        "required": ["backend", "state", "pinned", "action", "accepted"],
        "properties": {
            "backend": {"type": "string"},
            "state": {"type": "string", "description": "The backend's state when asked."},
            "pinned": {"type": "boolean"},
            "action": {"enum": ["load", "unload", "pin", "unpin"]},
            "accepted": {"const": True},
        },
    },
    "ProfileForgotten": {
        "type": "object",
        "required": ["backend", "forgotten", "store"],
        "properties": {
            "backend": {"type": "string"},
            "forgotten": {"const": True},
            "store": {"type": "boolean", "description": "Whether a stored profile was dropped."},
        },
    },
    "ModelRequest": {
        "description": "What yard reads of a proxied body: the `model` (JSON field, or form "
        "field of a multipart or url-encoded body). Everything else goes to the backend "
        "unchanged.",
        "type": "object",
        "required": ["model"],
        "properties": {"model": {"type": "string", "minLength": 1}},
    },
}

_AUTH_ERRORS = {
    "401": _error("No key, or not the right kind (`missing_api_key`, `invalid_admin_key`)."),
    "403": _error("A key yard does not know, or a request refused by who or where it is from."),
}

_HEADERS = [
    {
        "name": "X-Yard-Priority",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "A number; clamped to the app's range. Else `400 invalid_priority`.",
    },
    {
        "name": "X-Yard-Start-By",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "RFC 3339 time (with a zone) by which the work must have started.",
    },
    {
        "name": "X-Yard-Start-Within",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "Seconds from now by which the work must have started.",
    },
    {
        "name": "X-Yard-Not-Before",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "RFC 3339 time (with a zone) before which the work must not start: "
        "it waits held (a job: stored) until then, and its backend is loaded to be ready.",
    },
    {
        "name": "X-Yard-Start-After",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "Seconds from now before which the work must not start.",
    },
    {
        "name": "X-Yard-Allow-Late",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "`true` or `false`: run even once the deadline has passed.",
    },
    {
        "name": "Prefer",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "`respond-async` makes the request a job (202 and a `Location`); "
        "`rerun-safe` lets yard run it again after a restart.",
    },
]


def _proxied(summary: str, *, body: bool) -> Schema:
    """An operation yard proxies: its contract, not the backend's schema."""
    responses: Schema = {
        "200": {"description": "The backend's answer, unchanged (streams included)."},
        "202": {
            **_json(_ref("Job"), "Handed in as a job (`Prefer: respond-async`)."),
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
        "400": _error("`model_required`, `invalid_json`, a malformed `X-Yard-*` header, ..."),
        **_AUTH_ERRORS,
        "404": _error("`model_not_found` or `backend_not_found`."),
        "409": _error("`deadline_infeasible`: the deadline cannot be met."),
        "413": _error("`body_too_large` (server.max_body_bytes), `job_too_large`."),
        "429": _error(
            "`too_many_jobs`: the app's job quota (jobs.max_jobs_per_app) is used; "
            "`app_queue_full`: the app has [apps.NAME] max_queued requests waiting "
            "(`Retry-After`)."
        ),
        "502": _error("`backend_failed`: the backend died or answered something that is not HTTP."),
        "503": _error("`does_not_fit`, `queue_full`, `shutting_down`."),
        "504": _error("`deadline_missed`."),
        "507": _error("`job_storage_full`: jobs.max_stored_bytes_per_app is used."),
        "default": {"description": "The backend's own status and answer."},
    }
    operation: Schema = {"summary": summary, "parameters": _HEADERS, "responses": responses}
    if body:
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": _ref("ModelRequest")},
                "multipart/form-data": {"schema": _ref("ModelRequest")},
            },
        }
    return operation


def _op(summary: str, responses: Schema, **extra: Any) -> Schema:
    return {"summary": summary, "responses": responses, **extra}


def _path_param(name: str, description: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": description,
    }


def _query(name: str, description: str) -> Schema:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": description,
    }


_WAIT = _query("wait", "Seconds to wait for the job to end (long poll), at most jobs.max_wait_s.")
_JOB_ID = _path_param("job_id", "The job's id (from the 202's `Location`).")
_BACKEND = _path_param("name", "A backend of the configuration.")
_JOB_ERRORS = {
    **_AUTH_ERRORS,
    "404": _error("`job_not_found`: no such job for this key."),
    "501": _error("`jobs_unavailable`: this yard runs without the job service."),
}


def _paths() -> Schema:
    paths: Schema = {
        "/healthz": {
            "get": _op(
                "Whether yard is serving",
                {"200": _json(_ref("Health"), "Serving.")},
                security=[],
            )
        },
        "/openapi.json": {
            "get": _op(
                "This document",
                {"200": _json({"type": "object"}, "The OpenAPI 3.1 document.")},
                security=[],
            )
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics (text format 0.0.4)",
                {"200": _text("text/plain", "The metrics.")},
                security=[],
            )
        },
        "/v1/models": {
            "get": _op(
                "The models this yard serves",
                {"200": _json(_ref("ModelList"), "Every configured model."), **_AUTH_ERRORS},
            )
        },
        "/v1/models/{model}": {
            "get": _op(
                "One model",
                {
                    "200": _json(_ref("Model"), "The model."),
                    **_AUTH_ERRORS,
                    "404": _error("`model_not_found`."),
                },
                parameters=[_path_param("model", "The model's name.")],
            )
        },
        "/v1/jobs": {
            "get": _op(
                "The caller's jobs, newest first (the admin key sees every app's)",
                {
                    "200": _json(_ref("JobList"), "A page of jobs."),
                    "400": _error("`invalid_status`, `invalid_limit`, `invalid_cursor`."),
                    **_JOB_ERRORS,
                },
                parameters=[
                    _query("status", "Comma-separated: " + ", ".join(_JOB_STATUSES) + "."),
                    _query("limit", "1 to 100 (default 20)."),
                    _query("after", "The last id of the previous page."),
                ],
            )
        },
        "/v1/jobs/{job_id}": {
            "get": _op(
                "A job: status, place in the queue, why it waits, estimated start",
                {
                    "200": _json(_ref("Job"), "The job."),
                    "400": _error("`invalid_wait`."),
                    **_JOB_ERRORS,
                },
                parameters=[_JOB_ID, _WAIT],
            ),
            "delete": _op(
                "Cancel a job (leave the queue, or cancel the backend call)",
                {
                    "200": _json(_ref("Job"), "The job, cancelled."),
                    "409": _error("`job_finished`: it had already ended."),
                    **_JOB_ERRORS,
                },
                parameters=[_JOB_ID],
            ),
        },
        "/v1/jobs/{job_id}/result": {
            "get": _op(
                "The job's answer, exactly as the backend sent it",
                {
                    "200": {"description": "The backend's answer (its status, headers, bytes)."},
                    "400": _error("`invalid_wait`."),
                    "409": _error("`job_not_finished`, or `cancelled`: there is no result."),
                    "410": _error("`job_expired`: the result was deleted."),
                    **_JOB_ERRORS,
                    "default": {
                        "description": "A job that failed before the backend answered "
                        "gets the error a synchronous request would have got.",
                    },
                },
                parameters=[_JOB_ID, _WAIT],
            ),
            "delete": _op(
                "Delete a finished job's result (frees its room in the app's quota)",
                {
                    "200": _json(_ref("Job"), "The job, its result gone."),
                    "409": _error("`job_not_finished`: cancel it with DELETE /v1/jobs/ID."),
                    **_JOB_ERRORS,
                },
                parameters=[_JOB_ID],
            ),
        },
        "/admin/status": {
            "get": _op(
                "Everything the dashboard shows",
                {"200": _json(_ref("Status"), "The status document."), **_AUTH_ERRORS},
            )
        },
        "/admin/backends/{name}/{action}": {
            "post": _op(
                "Ask the scheduler to load, unload, pin or unpin a backend",
                {
                    "202": _json(_ref("BackendAction"), "Asked; the scheduler decides when."),
                    **_AUTH_ERRORS,
                    "404": _error("`backend_not_found` or `unknown_action`."),
                },
                parameters=[
                    _BACKEND,
                    {
                        "name": "action",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "enum": ["load", "unload", "pin", "unpin"]},
                    },
                ],
            )
        },
        "/admin/backends/{name}/log": {
            "get": _op(
                "The backend's log: the lines kept so far, then new ones as they come",
                {
                    "200": _text("text/event-stream", "Server-sent events, a line each."),
                    **_AUTH_ERRORS,
                    "404": _error("`backend_not_found`."),
                },
                parameters=[_BACKEND],
            )
        },
        "/admin/profiles/{name}": {
            "delete": _op(
                "Forget a backend's measured profile (the next load measures again)",
                {
                    "200": _json(_ref("ProfileForgotten"), "Forgotten."),
                    **_AUTH_ERRORS,
                    "404": _error("`backend_not_found`."),
                },
                parameters=[_BACKEND],
            )
        },
        "/dashboard": {
            "get": _op(
                "The live dashboard (HTML); with an admin key, its login form first",
                {
                    "200": _text("text/html", "The page."),
                    "401": _text("text/html", "The login form."),
                    "403": _text("text/plain", "Not from loopback, and no admin key is set."),
                },
            )
        },
        "/dashboard/login": {
            "post": _op(
                "Log in to the dashboard with the admin key (sets a session cookie)",
                {
                    "303": {"description": "Logged in: see /dashboard."},
                    "401": _text("text/html", "Wrong key: the form again."),
                    "413": {"description": "The form is larger than a login form can be."},
                    "429": {"description": "Too many wrong keys: wait (`Retry-After`)."},
                },
                requestBody={
                    "required": True,
                    "content": {
                        "application/x-www-form-urlencoded": {
                            "schema": {
                                "type": "object",
                                "properties": {"key": {"type": "string"}},
                            }
                        }
                    },
                },
            )
        },
        "/dashboard/logout": {
            "post": _op(
                "Log out (the session ends)",
                {"303": {"description": "Logged out: see /dashboard."}},
            )
        },
        "/dashboard/events": {
            "get": _op(
                "The dashboard's sections as server-sent events, whenever they change",
                {
                    "200": _text("text/event-stream", "`section` events."),
                    "401": _text("text/plain", "Log in first."),
                    "403": _text("text/plain", "Not from loopback, and no admin key is set."),
                },
            )
        },
        "/static/{filename}": {
            "get": _op(
                "Quart's static route (yard ships no files there)",
                {"404": _error("`not_found`.")},
                parameters=[_path_param("filename", "A file name.")],
                security=[],
            )
        },
        "/dashboard/static/{filename}": {
            "get": _op(
                "The dashboard's script and style sheet",
                {
                    "200": {"description": "The file."},
                    "404": {"description": "No such file."},
                },
                parameters=[_path_param("filename", "dashboard.js or dashboard.css.")],
            )
        },
    }
    for route in OPENAI_ROUTES:
        name = route.removeprefix("/v1/")
        paths[route] = {"post": _proxied(f"OpenAI-compatible {name}, routed by model", body=True)}
    paths["/backends/{backend}/{path}"] = {
        "parameters": [
            _path_param("backend", "A backend of the configuration."),
            _path_param("path", "The path on the backend (the query is passed on too)."),
        ],
        **{
            method: _proxied(
                f"{method.upper()} PATH on backend NAME, scheduled like any request",
                body=False,
            )
            for method in PROXY_METHODS
        },
    }
    paths.update(_batch_paths())
    paths.update(_announcement_paths())
    return paths


# -- the Batch API (yard.batches) ---------------------------------------------

_BATCH_STATUSES = [
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
_STAMP = {"type": _nullable("integer")}


def _list_of(item: str) -> Schema:
    return {
        "type": "object",
        "required": ["object", "data", "first_id", "last_id", "has_more"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ref(item)},
            "first_id": {"type": _nullable("string")},
            "last_id": {"type": _nullable("string")},
            "has_more": {"type": "boolean"},
        },
    }


_BATCH_SCHEMAS: dict[str, Schema] = {
    "File": {
        "description": "A stored file (OpenAI's file object).",
        "type": "object",
        "required": ["id", "object", "bytes", "created_at", "filename", "purpose", "status"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "file"},
            "bytes": {"type": "integer"},
            "created_at": {"type": "integer"},
            "expires_at": _STAMP,
            "filename": {"type": "string"},
            "purpose": {"enum": ["batch", "batch_output"]},
            "status": {"const": "processed"},
            "status_details": {"type": _nullable("string")},
        },
    },
    "FileList": _list_of("File"),
    "FileDeleted": {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "file"},
            "deleted": {"type": "boolean"},
        },
    },
    "FileUpload": {
        "type": "object",
        "required": ["file", "purpose"],
        "properties": {
            "file": {"type": "string", "contentMediaType": "application/octet-stream"},
            "purpose": {"const": "batch"},
        },
    },
    "BatchCreate": {
        "type": "object",
        "required": ["input_file_id", "endpoint", "completion_window"],
        "properties": {
            "input_file_id": {"type": "string"},
            "endpoint": {
                "enum": [
                    "/v1/chat/completions",
                    "/v1/completions",
                    "/v1/embeddings",
                    "/v1/responses",
                    "/v1/moderations",
                ]
            },
            "completion_window": {
                "type": "string",
                "description": 'Whole hours, 1h to jobs.batch_max_window_s ("24h").',
            },
            "metadata": {
                "type": _nullable("object"),
                "additionalProperties": {"type": "string"},
            },
        },
    },
    "Batch": {
        "description": "A batch (OpenAI's batch object). Every line is a job of the app.",
        "type": "object",
        "required": ["id", "object", "endpoint", "input_file_id", "completion_window", "status"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "batch"},
            "endpoint": {"type": "string"},
            "errors": {
                "type": _nullable("object"),
                "properties": {
                    "object": {"const": "list"},
                    "data": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "param": {"type": _nullable("string")},
                                "line": {"type": _nullable("integer")},
                            },
                        },
                    },
                },
            },
            "input_file_id": {"type": "string"},
            "completion_window": {"type": "string"},
            "status": {"enum": _BATCH_STATUSES},
            "output_file_id": {"type": _nullable("string")},
            "error_file_id": {"type": _nullable("string")},
            "created_at": {"type": "integer"},
            "in_progress_at": _STAMP,
            "expires_at": _STAMP,
            "finalizing_at": _STAMP,
            "completed_at": _STAMP,
            "failed_at": _STAMP,
            "expired_at": _STAMP,
            "cancelling_at": _STAMP,
            "cancelled_at": _STAMP,
            "request_counts": {
                "type": "object",
                "properties": {
                    "total": {"type": "integer"},
                    "completed": {"type": "integer"},
                    "failed": {"type": "integer"},
                },
            },
            "metadata": {"type": _nullable("object")},
        },
    },
    "BatchList": _list_of("Batch"),
}
_FILE_ID = _path_param("file_id", "The file's id (`file-...`).")
_BATCH_ID = _path_param("batch_id", "The batch's id (`batch_...`).")
_BATCH_ERRORS = {
    **_AUTH_ERRORS,
    "501": _error("`batches_unavailable`: this yard runs without the job service."),
}


def _batch_paths() -> Schema:
    file_404 = {"404": _error("`file_not_found`: no such file for this key.")}
    batch_404 = {"404": _error("`batch_not_found`: no such batch for this key.")}
    cursor = _query("after", "The last id of the previous page.")
    return {
        "/v1/files": {
            "post": _op(
                "Upload a batch input file (multipart: file, purpose=batch)",
                {
                    "200": _json(_ref("File"), "Stored."),
                    "400": _error("`invalid_purpose`, `missing_required_parameter`."),
                    "403": _error("`admin_cannot_submit`: use an app's key."),
                    "413": _error("`file_too_large` (jobs.batch_max_file_bytes)."),
                    "429": _error("`too_many_files` (jobs.batch_max_files_per_app)."),
                    **_BATCH_ERRORS,
                },
                requestBody={
                    "required": True,
                    "content": {"multipart/form-data": {"schema": _ref("FileUpload")}},
                },
            ),
            "get": _op(
                "The caller's files (the admin key sees every app's)",
                {
                    "200": _json(_ref("FileList"), "A page of files."),
                    "400": _error("`invalid_limit`, `invalid_order`."),
                    **file_404,
                    **_BATCH_ERRORS,
                },
                parameters=[
                    _query("purpose", "Only files of this purpose."),
                    _query("limit", "1 to 10000 (default 10000)."),
                    _query("order", "asc or desc (default desc)."),
                    cursor,
                ],
            ),
        },
        "/v1/files/{file_id}": {
            "get": _op(
                "A file",
                {"200": _json(_ref("File"), "The file."), **file_404, **_BATCH_ERRORS},
                parameters=[_FILE_ID],
            ),
            "delete": _op(
                "Delete a file",
                {"200": _json(_ref("FileDeleted"), "Deleted."), **file_404, **_BATCH_ERRORS},
                parameters=[_FILE_ID],
            ),
        },
        "/v1/files/{file_id}/content": {
            "get": _op(
                "A file's bytes (an output or error file: OpenAI's JSONL line format)",
                {
                    "200": _text("application/octet-stream", "The bytes."),
                    **file_404,
                    **_BATCH_ERRORS,
                },
                parameters=[_FILE_ID],
            )
        },
        "/v1/batches": {
            "post": _op(
                "Create a batch (`Prefer: rerun-safe`: a line interrupted by a restart "
                "runs once more)",
                {
                    "200": _json(_ref("Batch"), "Created, validating."),
                    "400": _error(
                        "`invalid_request`, `invalid_completion_window`, `invalid_metadata` "
                        "(`param` names the field)."
                    ),
                    "403": _error("`admin_cannot_submit`: use an app's key."),
                    **file_404,
                    **_BATCH_ERRORS,
                },
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": _ref("BatchCreate")}},
                },
            ),
            "get": _op(
                "The caller's batches, newest first (the admin key sees every app's)",
                {
                    "200": _json(_ref("BatchList"), "A page of batches."),
                    "400": _error("`invalid_limit`."),
                    **batch_404,
                    **_BATCH_ERRORS,
                },
                parameters=[_query("limit", "1 to 100 (default 20)."), cursor],
            ),
        },
        "/v1/batches/{batch_id}": {
            "get": _op(
                "A batch: status, request counts, output and error files",
                {"200": _json(_ref("Batch"), "The batch."), **batch_404, **_BATCH_ERRORS},
                parameters=[_BATCH_ID],
            )
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": _op(
                "Cancel a batch: queued lines end `batch_cancelled`, running ones finish",
                {
                    "200": _json(_ref("Batch"), "Cancelling (or cancelled)."),
                    **batch_404,
                    "409": _error("`batch_not_cancellable`: it has ended."),
                    **_BATCH_ERRORS,
                },
                parameters=[_BATCH_ID],
            )
        },
    }


# -- announcements (yard.announce) ---------------------------------------------

_ANNOUNCEMENT_SCHEMAS: dict[str, Schema] = {
    "AnnouncementCreate": {
        "type": "object",
        "required": ["model"],
        "additionalProperties": False,
        "properties": {
            "model": {"type": "string"},
            "not_before": {"type": "string", "description": "RFC 3339: the window opens."},
            "start_after": {"type": "number", "description": "Seconds from now (default 0)."},
            "start_by": {"type": "string", "description": "RFC 3339: the window closes."},
            "window_s": {"type": "number", "description": "The window's length in seconds."},
            "count": {"type": "integer", "minimum": 1, "description": "Requests (default 1)."},
            "priority": {"type": "number", "description": "Clamped to the app's max_priority."},
        },
    },
    "Announcement": {
        "type": "object",
        "required": ["id", "object", "app", "model", "not_before", "start_by", "count", "status"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "announcement"},
            "app": {"type": "string"},
            "model": {"type": "string"},
            "not_before": {"type": "string"},
            "start_by": {"type": "string"},
            "count": {"type": "integer"},
            "used": {"type": "integer"},
            "priority": {"type": "number"},
            "status": {"enum": ["open", "used", "expired", "withdrawn"]},
            "source": {"enum": ["api", "config"]},
            "created_at": {"type": "string"},
            "ended_at": {"type": _nullable("string")},
        },
    },
    "AnnouncementList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ref("Announcement")},
        },
    },
}


def _announcement_paths() -> Schema:
    errors = {
        **_AUTH_ERRORS,
        "404": _error("`announcement_not_found`: no such announcement for this key."),
        "501": _error("`announcements_unavailable`: this yard runs without the job store."),
    }
    ann_id = _path_param("announcement_id", "The announcement's id (`ann_...`).")
    return {
        "/v1/announcements": {
            "post": _op(
                "Announce work ahead: count requests for a model inside a window; yard "
                "loads the model to be ready when it opens and keeps it for the window",
                {
                    "201": _json(_ref("Announcement"), "Announced."),
                    "400": _error(
                        "`invalid_json`, `invalid_request`, `unknown_parameter`, "
                        "`invalid_window`, `invalid_count`, `invalid_priority` (`param` names "
                        "the field)."
                    ),
                    **errors,
                    "404": _error("`model_not_found`: no such model for this key."),
                    "429": _error(
                        "`too_many_announcements`: the app has max_announcements open "
                        "([scheduler] or [apps.NAME])."
                    ),
                },
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": _ref("AnnouncementCreate")}},
                },
            ),
            "get": _op(
                "The caller's announcements, newest first (the admin key sees every app's)",
                {"200": _json(_ref("AnnouncementList"), "Announcements."), **errors},
            ),
        },
        "/v1/announcements/{announcement_id}": {
            "get": _op(
                "An announcement: its window, status and how many of its requests came",
                {"200": _json(_ref("Announcement"), "The announcement."), **errors},
                parameters=[ann_id],
            ),
            "delete": _op(
                "Withdraw an announcement (it ends `withdrawn`)",
                {"200": _json(_ref("Announcement"), "Withdrawn (or as it ended)."), **errors},
                parameters=[ann_id],
            ),
        },
    }


# What yard's HTTP server and its browser guard may answer before any route
# runs; every operation can get these.
_EDGE: Schema = {
    "400": _error("`malformed_request`: the request is not valid HTTP/1.1."),
    "403": _error(
        "`host_not_allowed` (a Host yard does not answer to) or `cross_origin_refused` "
        "(a state change from another site's page)."
    ),
    "408": _error("`request_timeout`: the head or body stopped coming (server.*_timeout_s)."),
    "431": _error("`request_head_too_large`."),
    "501": _error("`unsupported_transfer_coding`."),
    "503": _error(
        "`too_many_connections` (server.max_connections; `Retry-After`), or yard is stopping."
    ),
    "505": _error("`http_version_not_supported`."),
}


def _with_edge(paths: Schema) -> Schema:
    for item in paths.values():
        for name, operation in item.items():
            if name != "parameters":
                operation["responses"] = {**_EDGE, **operation["responses"]}
    return paths


def document() -> Schema:
    """The OpenAPI 3.1 document (a new dict each call)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "yard",
            "version": __version__,
            "summary": "A bouncer for the GPU: one gateway in front of local model servers.",
            "description": "Apps keep the API they speak (mostly OpenAI's) and change only "
            "their base URL. Errors yard answers itself are JSON in OpenAI's error shape "
            "with a stable `code`; a backend's own answers pass through unchanged.",
        },
        "servers": [{"url": "/"}],
        "security": [{"apiKey": []}],
        "paths": _with_edge(_paths()),
        "components": {
            "schemas": {**_SCHEMAS, **_BATCH_SCHEMAS, **_ANNOUNCEMENT_SCHEMAS},
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An app's key ([apps.NAME] key) for the data plane and "
                    "jobs; the admin key (server.admin_key) for /admin and every app's jobs. "
                    "With no keys configured, yard listens on loopback and needs none.",
                }
            },
        },
    }


def register(app: Quart) -> None:
    """Serve :func:`document` at ``GET /openapi.json`` on ``app``."""
    body = json.dumps(document()).encode()

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return Response(body, 200, content_type="application/json")
