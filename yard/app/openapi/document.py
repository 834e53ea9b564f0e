"""The whole document, put together from its sections, and the route that serves it.

This module documents the service routes itself (``/healthz``, this document,
``/metrics``, ``/v1/models``); the other sections are in their own modules.
"""

from __future__ import annotations

import json

from quart import Quart, Response

from yard import __version__
from yard.app.openapi import admin, announcements, batches, common, jobs, proxied
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
    text_response,
    with_edge,
)

SCHEMAS: dict[str, Schema] = {
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
                "type": nullable("integer"),
                "description": "The context size the running backend was started with, "
                "chosen within its configured context range (null: not running, or no range).",
            },
            "parallel": {
                "type": nullable("integer"),
                "description": "The slot count (requests served at once) the running backend "
                "was started with, chosen within its configured parallel range after the "
                "context (null: not running, or no range).",
            },
            "instances": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Only for a backend with several instances (`instances = N`): "
                "their names, the first first (`news-llm`, `news-llm@2`, ...). `state` is "
                "then `ready` when any of them is.",
            },
        },
    },
    "ModelList": list_of("Model"),
}


def paths() -> Schema:
    """The service routes: health, this document, metrics and the model list."""
    return {
        "/healthz": {
            "get": op(
                "Whether yard is serving",
                {"200": json_response(ref("Health"), "Serving.")},
                security=[],
            )
        },
        "/openapi.json": {
            "get": op(
                "This document",
                {"200": json_response({"type": "object"}, "The OpenAPI 3.1 document.")},
                security=[],
            )
        },
        "/metrics": {
            "get": op(
                "Prometheus metrics (text format 0.0.4)",
                {"200": text_response("text/plain", "The metrics.")},
                security=[],
            )
        },
        "/v1/models": {
            "get": op(
                "The models this yard serves",
                {"200": json_response(ref("ModelList"), "Every configured model."), **AUTH_ERRORS},
            )
        },
        "/v1/models/{model}": {
            "get": op(
                "One model",
                {
                    "200": json_response(ref("Model"), "The model."),
                    **AUTH_ERRORS,
                    "404": error_response("`model_not_found`."),
                },
                parameters=[path_param("model", "The model's name.")],
            )
        },
    }


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
        "paths": with_edge(
            {
                **paths(),
                **jobs.paths(),
                **admin.paths(),
                **proxied.paths(),
                **batches.paths(),
                **announcements.paths(),
            }
        ),
        "components": {
            "schemas": {
                **common.SCHEMAS,
                **SCHEMAS,
                **jobs.SCHEMAS,
                **admin.SCHEMAS,
                **proxied.SCHEMAS,
                **batches.SCHEMAS,
                **announcements.SCHEMAS,
            },
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
