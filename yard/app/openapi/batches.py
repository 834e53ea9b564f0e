"""The Batch API (``/v1/files``, ``/v1/batches``, :mod:`yard.batches`)."""

from __future__ import annotations

from typing import get_args

from yard.app.openapi.common import (
    AFTER,
    Schema,
    error_response,
    forbidden,
    json_response,
    nullable,
    op,
    page_of,
    path_param,
    query,
    ref,
    service_errors,
    text_response,
)
from yard.batches.records import ENDPOINTS, BatchStatus

_BATCH_STATUSES = list(get_args(BatchStatus))
_STAMP = {"type": nullable("integer")}


SCHEMAS: dict[str, Schema] = {
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
            "status_details": {"type": nullable("string")},
        },
    },
    "FileList": page_of("File"),
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
            "endpoint": {"enum": list(ENDPOINTS)},
            "completion_window": {
                "type": "string",
                "description": 'Whole hours, 1h to jobs.batch_max_window_s ("24h").',
            },
            "metadata": {
                "type": nullable("object"),
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
                "type": nullable("object"),
                "properties": {
                    "object": {"const": "list"},
                    "data": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "param": {"type": nullable("string")},
                                "line": {"type": nullable("integer")},
                            },
                        },
                    },
                },
            },
            "input_file_id": {"type": "string"},
            "completion_window": {"type": "string"},
            "status": {"enum": _BATCH_STATUSES},
            "output_file_id": {"type": nullable("string")},
            "error_file_id": {"type": nullable("string")},
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
            "metadata": {"type": nullable("object")},
        },
    },
    "BatchList": page_of("Batch"),
}
_FILE_ID = path_param("file_id", "The file's id (`file-...`).")
_BATCH_ID = path_param("batch_id", "The batch's id (`batch_...`).")
_BATCH_ERRORS = service_errors("`batches_unavailable`: this yard runs without the job service.")
_APP_ONLY = forbidden("`admin_cannot_submit`: use an app's key")


def paths() -> Schema:
    file_404 = {"404": error_response("`file_not_found`: no such file for this key.")}
    batch_404 = {"404": error_response("`batch_not_found`: no such batch for this key.")}
    return {
        "/v1/files": {
            "post": op(
                "Upload a batch input file (multipart: file, purpose=batch)",
                {
                    "200": json_response(ref("File"), "Stored."),
                    "400": error_response("`invalid_purpose`, `missing_required_parameter`."),
                    "413": error_response("`file_too_large` (jobs.batch_max_file_bytes)."),
                    "429": error_response("`too_many_files` (jobs.batch_max_files_per_app)."),
                    **_BATCH_ERRORS,
                    "403": _APP_ONLY,
                },
                requestBody={
                    "required": True,
                    "content": {"multipart/form-data": {"schema": ref("FileUpload")}},
                },
            ),
            "get": op(
                "The caller's files (the admin key sees every app's)",
                {
                    "200": json_response(ref("FileList"), "A page of files."),
                    "400": error_response("`invalid_limit`, `invalid_order`."),
                    **file_404,
                    **_BATCH_ERRORS,
                },
                parameters=[
                    query("purpose", "Only files of this purpose."),
                    query("limit", "1 to 10000 (default 10000)."),
                    query("order", "asc or desc (default desc)."),
                    AFTER,
                ],
            ),
        },
        "/v1/files/{file_id}": {
            "get": op(
                "A file",
                {"200": json_response(ref("File"), "The file."), **file_404, **_BATCH_ERRORS},
                parameters=[_FILE_ID],
            ),
            "delete": op(
                "Delete a file",
                {"200": json_response(ref("FileDeleted"), "Deleted."), **file_404, **_BATCH_ERRORS},
                parameters=[_FILE_ID],
            ),
        },
        "/v1/files/{file_id}/content": {
            "get": op(
                "A file's bytes (an output or error file: OpenAI's JSONL line format)",
                {
                    "200": text_response("application/octet-stream", "The bytes."),
                    **file_404,
                    **_BATCH_ERRORS,
                },
                parameters=[_FILE_ID],
            )
        },
        "/v1/batches": {
            "post": op(
                "Create a batch (`Prefer: rerun-safe`: a line interrupted by a restart "
                "runs once more)",
                {
                    "200": json_response(ref("Batch"), "Created, validating."),
                    "400": error_response(
                        "`invalid_request`, `invalid_completion_window`, `invalid_metadata` "
                        "(`param` names the field)."
                    ),
                    **file_404,
                    **_BATCH_ERRORS,
                    "403": _APP_ONLY,
                },
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": ref("BatchCreate")}},
                },
            ),
            "get": op(
                "The caller's batches, newest first (the admin key sees every app's)",
                {
                    "200": json_response(ref("BatchList"), "A page of batches."),
                    "400": error_response("`invalid_limit`."),
                    **batch_404,
                    **_BATCH_ERRORS,
                },
                parameters=[query("limit", "1 to 100 (default 20)."), AFTER],
            ),
        },
        "/v1/batches/{batch_id}": {
            "get": op(
                "A batch: status, request counts, output and error files",
                {"200": json_response(ref("Batch"), "The batch."), **batch_404, **_BATCH_ERRORS},
                parameters=[_BATCH_ID],
            )
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": op(
                "Cancel a batch: queued lines end `batch_cancelled`, running ones finish",
                {
                    "200": json_response(ref("Batch"), "Cancelling (or cancelled)."),
                    **batch_404,
                    "409": error_response("`batch_not_cancellable`: it has ended."),
                    **_BATCH_ERRORS,
                },
                parameters=[_BATCH_ID],
            )
        },
    }
