"""The admin API (``/admin/...``) and the dashboard (:mod:`yard.observe`)."""

from __future__ import annotations

from yard.app.openapi.common import (
    AUTH_ERRORS,
    Schema,
    error_response,
    json_response,
    nullable,
    op,
    path_param,
    ref,
    text_response,
)

_TIMES = {
    "type": "number",
    "description": "Engine time; each has a `*_wall` twin in epoch seconds.",
}

SCHEMAS: dict[str, Schema] = {
    "Timeline": {
        "description": "The dashboard's timeline: per device and backend, the last hour "
        "(`spans`: `loading`, `loaded`, `serving`, `stopping`; `end` null while it goes on) "
        "and the work ahead (`windows`: `announced` or `held`). Devices such as `gpu0|gpu1` "
        "hold windows of a backend not loaded lately.",
        "type": "object",
        "required": ["now", "wall_now", "start", "end", "devices", "beyond"],
        "properties": {
            "now": _TIMES,
            "wall_now": {"type": "number"},
            "start": _TIMES,
            "end": _TIMES,
            "beyond": {
                "type": "integer",
                "description": "Windows further ahead than the picture shows (2 h).",
            },
            "devices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "lanes"],
                    "properties": {
                        "name": {"type": "string"},
                        "lanes": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["backend", "models", "spans", "windows"],
                                "properties": {
                                    "backend": {"type": "string"},
                                    "models": {"type": "array", "items": {"type": "string"}},
                                    "spans": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["kind", "start", "end", "note"],
                                            "properties": {
                                                "kind": {
                                                    "type": "string",
                                                    "enum": [
                                                        "loading",
                                                        "loaded",
                                                        "serving",
                                                        "stopping",
                                                    ],
                                                },
                                                "start": _TIMES,
                                                "end": {"type": nullable("number")},
                                                "note": {"type": "string"},
                                            },
                                        },
                                    },
                                    "windows": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": [
                                                "id",
                                                "kind",
                                                "app",
                                                "left",
                                                "opens",
                                                "closes",
                                                "loads_from",
                                            ],
                                            "properties": {
                                                "id": {"type": "string"},
                                                "kind": {
                                                    "type": "string",
                                                    "enum": ["announced", "held"],
                                                },
                                                "app": {"type": "string"},
                                                "priority": {"type": "number"},
                                                "left": {"type": "integer"},
                                                "label": {"type": "string"},
                                                "opens": _TIMES,
                                                "closes": _TIMES,
                                                "loads_from": _TIMES,
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
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
            "uptime_s": {"type": nullable("number")},
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
                        "context": {"type": nullable("integer")},
                        "parallel": {"type": nullable("integer")},
                        "reason": {"type": nullable("string")},
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
                        "models": {"type": nullable("array"), "items": {"type": "string"}},
                        "max_queued": {"type": nullable("integer")},
                        "max_concurrent": {"type": nullable("integer")},
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
            "accepted": {
                "type": "boolean",
                "description": "Whether anything was asked (false: nothing to do, see `detail`).",
            },
            "instances": {
                "type": "array",
                "description": "For a backend with several instances named as a whole: the "
                "instances acted on, each with its state when asked.",
                "items": {
                    "type": "object",
                    "required": ["backend", "state", "pinned"],
                    "properties": {
                        "backend": {"type": "string"},
                        "state": {"type": "string"},
                        "pinned": {"type": "boolean"},
                    },
                },
            },
            "detail": {
                "type": "string",
                "description": "For a backend with several instances: what was acted on, and why.",
            },
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
}

_BACKEND = path_param("name", "A backend of the configuration.")
_ACTED_ON = path_param(
    "name",
    "A backend of the configuration. For one with several instances, its name acts on "
    "all of them (`load`: the first not loaded), `NAME@2` on one, `NAME@1` on the first.",
)


def paths() -> Schema:
    """``/admin/...``, and ``/dashboard`` and its parts."""
    return {
        "/admin/status": {
            "get": op(
                "Everything the dashboard shows",
                {"200": json_response(ref("Status"), "The status document."), **AUTH_ERRORS},
            )
        },
        "/admin/timeline": {
            "get": op(
                "The dashboard's timeline as data: the last hour per device and backend, "
                "and the announced windows and held work ahead",
                {"200": json_response(ref("Timeline"), "The timeline."), **AUTH_ERRORS},
            )
        },
        "/admin/backends/{name}/{action}": {
            "post": op(
                "Ask the scheduler to load, unload, pin or unpin a backend",
                {
                    "202": json_response(
                        ref("BackendAction"), "Asked; the scheduler decides when."
                    ),
                    "200": json_response(
                        ref("BackendAction"),
                        "Nothing to do for the instances of a backend (`accepted` false).",
                    ),
                    **AUTH_ERRORS,
                    "404": error_response("`backend_not_found` or `unknown_action`."),
                },
                parameters=[
                    _ACTED_ON,
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
            "get": op(
                "The backend's log: the lines kept so far, then new ones as they come",
                {
                    "200": text_response("text/event-stream", "Server-sent events, a line each."),
                    **AUTH_ERRORS,
                    "404": error_response("`backend_not_found`."),
                },
                parameters=[_BACKEND],
            )
        },
        "/admin/profiles/{name}": {
            "delete": op(
                "Forget a backend's measured profile (the next load measures again)",
                {
                    "200": json_response(ref("ProfileForgotten"), "Forgotten."),
                    **AUTH_ERRORS,
                    "404": error_response("`backend_not_found`."),
                },
                parameters=[_BACKEND],
            )
        },
        "/dashboard": {
            "get": op(
                "The live dashboard (HTML); with an admin key, its login form first",
                {
                    "200": text_response("text/html", "The page."),
                    "401": text_response("text/html", "The login form."),
                    "403": text_response(
                        "text/plain", "Not from loopback, and no admin key is set."
                    ),
                },
            )
        },
        "/dashboard/login": {
            "post": op(
                "Log in to the dashboard with the admin key (sets a session cookie)",
                {
                    "303": {"description": "Logged in: see /dashboard."},
                    "401": text_response("text/html", "Wrong key: the form again."),
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
            "post": op(
                "Log out (the session ends)",
                {"303": {"description": "Logged out: see /dashboard."}},
            )
        },
        "/dashboard/events": {
            "get": op(
                "The dashboard's sections as server-sent events, whenever they change",
                {
                    "200": text_response("text/event-stream", "`section` events."),
                    "401": text_response("text/plain", "Log in first."),
                    "403": text_response(
                        "text/plain", "Not from loopback, and no admin key is set."
                    ),
                },
            )
        },
        "/dashboard/static/{filename}": {
            "get": op(
                "The dashboard's script and style sheet",
                {
                    "200": {"description": "The file."},
                    "404": {"description": "No such file."},
                },
                parameters=[path_param("filename", "dashboard.js or dashboard.css.")],
            )
        },
    }
