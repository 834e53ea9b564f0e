"""What every part of the document shares: the error shape and its codes, the
answers yard's HTTP server and browser guard give before any route runs, and
small builders of schema pieces."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

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


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(kind: str | list[str]) -> list[str]:
    return [*([kind] if isinstance(kind, str) else kind), "null"]


def json_response(schema: Schema, description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def error_response(description: str) -> Schema:
    return json_response(ref("Error"), description)


def text_response(media: str, description: str) -> Schema:
    return {"description": description, "content": {media: {"schema": {"type": "string"}}}}


_FORBIDDEN = "A request refused by who or where it is from"
AUTH_ERRORS = {
    "401": error_response(
        "No key, a key yard does not know, no `Bearer` before it, or not the right kind "
        "(`missing_api_key`, `invalid_api_key`, `invalid_admin_key`)."
    ),
    "403": error_response(_FORBIDDEN + "."),
}
"""What any route that needs a key may answer."""


def forbidden(why: str) -> Schema:
    """The 403 of a route that refuses more than :data:`AUTH_ERRORS` says:
    its description with ``why`` added."""
    return error_response(f"{_FORBIDDEN}, or {why}.")


def service_errors(unavailable: str) -> Schema:
    """:data:`AUTH_ERRORS` and the 501 of a route whose service may be off
    (``unavailable``: its code and why)."""
    return {**AUTH_ERRORS, "501": error_response(unavailable)}


def list_of(item: str) -> Schema:
    """A whole list of ``item`` (``{"object": "list", "data": [...]}``)."""
    return {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": ref(item)},
        },
    }


def page_of(item: str) -> Schema:
    """One page of a list of ``item``, with OpenAI's cursor fields (the next
    page starts ``after`` the ``last_id``)."""
    whole = list_of(item)
    return {
        "type": "object",
        "required": [*whole["required"], "first_id", "last_id", "has_more"],
        "properties": {
            **whole["properties"],
            "first_id": {"type": nullable("string")},
            "last_id": {"type": nullable("string")},
            "has_more": {"type": "boolean"},
        },
    }


def op(summary: str, responses: Schema, **extra: Any) -> Schema:
    return {"summary": summary, "responses": responses, **extra}


def _param(where: str, name: str, description: str) -> Schema:
    """A string parameter ``in`` ``where`` (required only in the path)."""
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "schema": {"type": "string"},
        "description": description,
    }


def path_param(name: str, description: str) -> Schema:
    return _param("path", name, description)


def query(name: str, description: str) -> Schema:
    return _param("query", name, description)


def header(name: str, description: str) -> Schema:
    return _param("header", name, description)


AFTER = query("after", "The last id of the previous page.")
"""The cursor of a paged list."""


# What yard's HTTP server and its browser guard may answer before any route
# runs; every operation can get these.
EDGE: Schema = {
    "400": error_response("`malformed_request`: the request is not valid HTTP/1.1."),
    "403": error_response(
        "`host_not_allowed` (a Host yard does not answer to) or `cross_origin_refused` "
        "(a state change from another site's page)."
    ),
    "408": error_response(
        "`request_timeout`: the head or body stopped coming (server.*_timeout_s)."
    ),
    "431": error_response("`request_head_too_large`."),
    "501": error_response("`unsupported_transfer_coding`."),
    "503": error_response(
        "`too_many_connections` (server.max_connections; `Retry-After`), or yard is stopping."
    ),
    "505": error_response("`http_version_not_supported`."),
}


def with_edge(paths: Schema) -> Schema:
    """``paths`` with :data:`EDGE` added to every operation's answers (in place).

    Where a route answers a status of its own that the edge can also answer
    (a 400, a 403), both causes are described: the route's first, then the
    edge's, so that neither hides the other.
    """
    for item in paths.values():
        for name, operation in item.items():
            if name == "parameters":
                continue
            responses = {**EDGE, **operation["responses"]}
            for status, edge in EDGE.items():
                own = operation["responses"].get(status)
                if own is not None and own is not edge:
                    text = f"{own['description']} Before the route: {edge['description']}"
                    responses[status] = {**own, "description": text}
            operation["responses"] = responses
    return paths


SCHEMAS: dict[str, Schema] = {
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
}
