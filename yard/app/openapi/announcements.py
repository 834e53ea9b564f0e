"""Announcements (``/v1/announcements``, :mod:`yard.announce`)."""

from __future__ import annotations

from yard.app.openapi.common import (
    AUTH_ERRORS,
    Schema,
    error_response,
    json_response,
    list_of,
    nullable,
    op,
    path_param,
    ref,
)

SCHEMAS: dict[str, Schema] = {
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
            "ended_at": {"type": nullable("string")},
        },
    },
    "AnnouncementList": list_of("Announcement"),
}


def paths() -> Schema:
    errors = {
        **AUTH_ERRORS,
        "404": error_response("`announcement_not_found`: no such announcement for this key."),
        "501": error_response("`announcements_unavailable`: this yard runs without the job store."),
    }
    ann_id = path_param("announcement_id", "The announcement's id (`ann_...`).")
    return {
        "/v1/announcements": {
            "post": op(
                "Announce work ahead: count requests for a model inside a window; yard "
                "loads the model to be ready when it opens and keeps it for the window",
                {
                    "201": json_response(ref("Announcement"), "Announced."),
                    "400": error_response(
                        "`invalid_json`, `invalid_request`, `unknown_parameter`, "
                        "`invalid_window`, `invalid_count`, `invalid_priority` (`param` names "
                        "the field)."
                    ),
                    **errors,
                    "404": error_response("`model_not_found`: no such model for this key."),
                    "429": error_response(
                        "`too_many_announcements`: the app has max_announcements open "
                        "([scheduler] or [apps.NAME])."
                    ),
                },
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": ref("AnnouncementCreate")}},
                },
            ),
            "get": op(
                "The caller's announcements, newest first (the admin key sees every app's)",
                {"200": json_response(ref("AnnouncementList"), "Announcements."), **errors},
            ),
        },
        "/v1/announcements/{announcement_id}": {
            "get": op(
                "An announcement: its window, status and how many of its requests came",
                {"200": json_response(ref("Announcement"), "The announcement."), **errors},
                parameters=[ann_id],
            ),
            "delete": op(
                "Withdraw an announcement (it ends `withdrawn`)",
                {
                    "200": json_response(ref("Announcement"), "Withdrawn (or as it ended)."),
                    **errors,
                },
                parameters=[ann_id],
            ),
        },
    }
