"""The Batch API over HTTP: ``/v1/files`` and ``/v1/batches`` (Quart
blueprints, mounted by :func:`register` with the batch service they serve).

- ``POST /v1/files`` (multipart: ``file``, ``purpose=batch``), ``GET /v1/files
  [?purpose=&limit=&order=&after=]``, ``GET /v1/files/ID``, ``GET
  /v1/files/ID/content``, ``DELETE /v1/files/ID``;
- ``POST /v1/batches`` (``input_file_id``, ``endpoint``, ``completion_window``,
  ``metadata``; ``Prefer: rerun-safe`` lets a line interrupted by a restart run
  once more), ``GET /v1/batches[?after=&limit=]``, ``GET /v1/batches/ID``,
  ``POST /v1/batches/ID/cancel``.

Files and batches belong to the app whose key handed them in; to every other
app they do not exist (404). The admin key reads every app's, and hands
nothing in. Errors are OpenAI's shape, with ``param`` where a field is wrong.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import trio
from quart import Blueprint, Quart, Response, current_app, request

from yard.api.body import json_object
from yard.api.errors import answer
from yard.api.keys import KeyCheck
from yard.api.served import Served, page
from yard.batches.service import Batches
from yard.batches.store import FileGone
from yard.batches.validate import BadRequest
from yard.batches.views import batch_json, file_json
from yard.config import AppConfig
from yard.errors import Rejected
from yard.h1.asgi import ResponseCut

files = Blueprint("files", __name__)
"""Mounted at ``/v1/files``."""
batches = Blueprint("batches", __name__)
"""Mounted at ``/v1/batches``."""

_DIGITS = re.compile(r"[0-9]{1,5}")


# A BadRequest is a Rejected: answered as every other refusal, its ``param`` included.
for _blueprint in (files, batches):
    _blueprint.register_error_handler(Rejected, answer)


_KEY = "yard.batches"


def register(app: Quart, service: Batches | None, keys: KeyCheck) -> None:
    """Mount ``/v1/files`` and ``/v1/batches`` on ``app``, serving ``service``
    (None: this yard runs without the job service; every call answers 501)."""
    app.extensions[_KEY] = Served(service, keys)
    app.register_blueprint(files, url_prefix="/v1/files")
    app.register_blueprint(batches, url_prefix="/v1/batches")


def _caller() -> tuple[Batches, AppConfig | None]:
    """The batch service and the caller's app (None: the admin, who reads all)."""
    served: Served[Batches] = current_app.extensions[_KEY]
    # The key first: a wrong one counts as a guess even where the service is off.
    app = served.keys.caller(request.headers.get("authorization"), request.remote_addr)
    service = served.service
    if service is None:
        raise BadRequest(
            501, "batches_unavailable", "this yard runs without the job service; no batches"
        )
    return service, app


def _app_only() -> tuple[Batches, AppConfig]:
    service, app = _caller()
    if app is None:
        raise BadRequest(
            403,
            "admin_cannot_submit",
            "files and batches belong to an app: hand them in with the app's key, not the "
            "admin key",
        )
    return service, app


def _limit(default: int, most: int) -> int:
    text = request.args.get("limit")
    if text is None:
        return default
    if not _DIGITS.fullmatch(text) or not 1 <= int(text) <= most:
        raise BadRequest(
            400, "invalid_limit", f"limit must be a whole number from 1 to {most}", "limit"
        )
    return int(text)


# -- files ----------------------------------------------------------------


@files.post("", strict_slashes=False)
async def upload() -> tuple[dict[str, object], int]:
    service, app = _app_only()
    form = await request.form
    uploaded = (await request.files).get("file")
    if uploaded is None:
        raise BadRequest(
            400,
            "missing_required_parameter",
            "send the file as the multipart field 'file' (and purpose=batch)",
            "file",
        )
    purpose = form.get("purpose")
    if not purpose:
        raise BadRequest(
            400, "missing_required_parameter", "purpose is required: purpose=batch", "purpose"
        )
    # A large upload waits in a temporary file: read in a worker thread, not
    # on the loop (55 MB held it 23-32 ms).
    content = await trio.to_thread.run_sync(uploaded.read)
    # Stored as UTF-8: a name with lone surrogates keeps the rest of its characters.
    name = (uploaded.filename or "upload.jsonl").encode("utf-8", "replace").decode()
    record = await service.upload(app=app.name, purpose=purpose, filename=name, content=content)
    return file_json(record), 200


@files.get("", strict_slashes=False)
async def list_files() -> dict[str, object]:
    service, app = _caller()
    limit = _limit(10_000, 10_000)
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest(400, "invalid_order", "order must be asc or desc", "order")
    after = request.args.get("after") or None
    after_seq = None
    if after is not None:
        after_seq = (await service.file(after, app=None if app is None else app.name)).seq
    found = await service.store.list_files(
        app=None if app is None else app.name,
        purpose=request.args.get("purpose") or None,
        limit=limit + 1,
        after_seq=after_seq,
        ascending=order == "asc",
    )
    return page([file_json(f) for f in found[:limit]], has_more=len(found) > limit)


@files.get("/<file_id>")
async def get_file(file_id: str) -> dict[str, object]:
    service, app = _caller()
    return file_json(await service.file(file_id, app=None if app is None else app.name))


@files.get("/<file_id>/content")
async def file_content(file_id: str) -> Response:
    service, app = _caller()
    record = await service.file(file_id, app=None if app is None else app.name)
    stream = await service.store.content_stream(record.id)
    if stream is None:  # pragma: no cover - deleted between the two reads
        raise BadRequest(404, "file_not_found", f"no file {file_id!r} for this API key")
    # The head goes out after the first read, the file a few MiB at a time
    # after it (the server writes each piece and takes turns between them).
    # A file deleted meanwhile ends the body short of the Content-Length: the
    # server closes the connection, which HTTP clients report as an error
    # rather than a complete file, and logs one warning.
    response = Response(_cut_if_gone(stream.pieces), content_type="application/octet-stream")
    response.content_length = stream.length
    return response


async def _cut_if_gone(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for piece in pieces:
            yield piece
    except FileGone as gone:
        raise ResponseCut(str(gone)) from None


@files.delete("/<file_id>")
async def delete_file(file_id: str) -> dict[str, object]:
    service, app = _caller()
    record = await service.file(file_id, app=None if app is None else app.name)
    deleted = await service.store.delete_file(record.id)
    return {"id": record.id, "object": "file", "deleted": deleted}


# -- batches ----------------------------------------------------------------


@batches.post("", strict_slashes=False)
async def create_batch() -> tuple[dict[str, object], int]:
    service, app = _app_only()
    payload = json_object(
        await request.get_data(as_text=False),
        expected="input_file_id, endpoint, completion_window (and metadata)",
    )
    prefer = request.headers.get("prefer", "")
    tokens = {t.strip().split("=")[0].lower() for t in prefer.replace(";", ",").split(",")}
    batch = await service.create(
        app=app,
        input_file_id=payload.get("input_file_id"),
        endpoint=payload.get("endpoint"),
        completion_window=payload.get("completion_window"),
        metadata=payload.get("metadata"),
        rerun_safe="rerun-safe" in tokens,
    )
    return batch_json(batch, counts=(0, 0)), 200


@batches.get("", strict_slashes=False)
async def list_batches() -> dict[str, object]:
    service, app = _caller()
    owner = None if app is None else app.name
    limit = _limit(20, 100)
    after = request.args.get("after") or None
    before_seq = None if after is None else (await service.get(after, app=owner)).seq
    found = await service.store.list_batches(app=owner, limit=limit + 1, before_seq=before_seq)
    data = [batch_json(b, counts=await service.counts(b)) for b in found[:limit]]
    return page(data, has_more=len(found) > limit)


@batches.get("/<batch_id>")
async def get_batch(batch_id: str) -> dict[str, object]:
    service, app = _caller()
    batch = await service.get(batch_id, app=None if app is None else app.name)
    return batch_json(batch, counts=await service.counts(batch))


@batches.post("/<batch_id>/cancel")
async def cancel_batch(batch_id: str) -> dict[str, object]:
    service, app = _caller()
    batch = await service.cancel(batch_id, app=None if app is None else app.name)
    return batch_json(batch, counts=await service.counts(batch))
