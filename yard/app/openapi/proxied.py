"""The routes yard proxies (the OpenAI-compatible ``/v1/*`` and
``/backends/NAME/PATH``), by their contract only: what yard reads (the
``model`` field, the ``X-Yard-*`` headers, ``Prefer: respond-async``) and
yard's own answers. The backend's answer passes through unchanged, so its
schema is the backend's."""

from __future__ import annotations

from yard.app.openapi.common import (
    AUTH_ERRORS,
    Schema,
    error_response,
    header,
    json_response,
    path_param,
    ref,
)

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

SCHEMAS: dict[str, Schema] = {
    "ModelRequest": {
        "description": "What yard reads of a proxied body: the `model` (JSON field, or form "
        "field of a multipart or url-encoded body). Everything else goes to the backend "
        "unchanged.",
        "type": "object",
        "required": ["model"],
        "properties": {"model": {"type": "string", "minLength": 1}},
    },
}

_HEADERS = [
    header("X-Yard-Priority", "A number; clamped to the app's range. Else `400 invalid_priority`."),
    header("X-Yard-Start-By", "RFC 3339 time (with a zone) by which the work must have started."),
    header("X-Yard-Start-Within", "Seconds from now by which the work must have started."),
    header(
        "X-Yard-Not-Before",
        "RFC 3339 time (with a zone) before which the work must not start: "
        "it waits held (a job: stored) until then, and its backend is loaded to be ready.",
    ),
    header("X-Yard-Start-After", "Seconds from now before which the work must not start."),
    header("X-Yard-Allow-Late", "`true` or `false`: run even once the deadline has passed."),
    header(
        "Prefer",
        "`respond-async` makes the request a job (202 and a `Location`); "
        "`rerun-safe` lets yard run it again after a restart.",
    ),
]


def _proxied(summary: str, *, body: bool) -> Schema:
    """An operation yard proxies: its contract, not the backend's schema."""
    responses: Schema = {
        "200": {"description": "The backend's answer, unchanged (streams included)."},
        "202": {
            **json_response(ref("Job"), "Handed in as a job (`Prefer: respond-async`)."),
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
        "400": error_response(
            "`model_required`, `invalid_json`, a malformed `X-Yard-*` header, ..."
        ),
        **AUTH_ERRORS,
        "404": error_response("`model_not_found` or `backend_not_found`."),
        "409": error_response("`deadline_infeasible`: the deadline cannot be met."),
        "413": error_response("`body_too_large` (server.max_body_bytes), `job_too_large`."),
        "429": error_response(
            "`too_many_jobs`: the app's job quota (jobs.max_jobs_per_app) is used; "
            "`app_queue_full`: the app has [apps.NAME] max_queued requests waiting "
            "(`Retry-After`)."
        ),
        "502": error_response(
            "`backend_failed`: the backend died or answered something that is not HTTP."
        ),
        "503": error_response("`does_not_fit`, `queue_full`, `shutting_down`."),
        "504": error_response("`deadline_missed`."),
        "507": error_response("`job_storage_full`: jobs.max_stored_bytes_per_app is used."),
        "default": {"description": "The backend's own status and answer."},
    }
    operation: Schema = {"summary": summary, "parameters": _HEADERS, "responses": responses}
    if body:
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": ref("ModelRequest")},
                "multipart/form-data": {"schema": ref("ModelRequest")},
            },
        }
    return operation


def paths() -> Schema:
    """The OpenAI-compatible routes and ``/backends/{backend}/{path}``."""
    paths: Schema = {}
    for route in OPENAI_ROUTES:
        name = route.removeprefix("/v1/")
        paths[route] = {"post": _proxied(f"OpenAI-compatible {name}, routed by model", body=True)}
    paths["/backends/{backend}/{path}"] = {
        "parameters": [
            path_param("backend", "A backend of the configuration."),
            path_param("path", "The path on the backend (the query is passed on too)."),
        ],
        **{
            method: _proxied(
                f"{method.upper()} PATH on backend NAME, scheduled like any request",
                body=False,
            )
            for method in PROXY_METHODS
        },
    }
    return paths
