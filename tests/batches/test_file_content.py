"""A stored file is written and read back a piece at a time, byte for byte:
by the store (``content_pieces``, ``content``) and by ``GET
/v1/files/ID/content``, which sends it as several writes, not one body of
the whole file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, cast

import trio

from tests.batches.virtual import yard
from yard.app.web import Parts, create_control_app
from yard.batches.service import Batches
from yard.batches.store import BatchStore
from yard.db import BLOB_PIECE
from yard.engine import Engine
from yard.h1.asgi import ASGIApp, Message
from yard.jobs.store import JobStore
from yard.testing.upstream import FakeUpstream

SIZE = 2 * BLOB_PIECE + 7
"""Three pieces, the last one short."""


async def _store_file(store: BatchStore, content: bytes, file_id: str = "file-big") -> None:
    await store.add_file(
        file_id=file_id,
        app="alice",
        purpose="batch_output",
        filename="out.jsonl",
        content=content,
        created_at=1.0,
    )


async def test_a_file_of_several_pieces_reads_back_byte_identical(tmp_path: Path) -> None:
    content = os.urandom(SIZE)
    jobs = await JobStore.open(tmp_path / "jobs.sqlite")
    try:
        store = BatchStore(jobs)
        await _store_file(store, content)
        await _store_file(store, b"", "file-empty")
        pieces = await store.content_pieces("file-big")
        assert pieces is not None
        assert [len(piece) for piece in pieces] == [BLOB_PIECE, BLOB_PIECE, 7]
        assert hashlib.sha256(b"".join(pieces)).digest() == hashlib.sha256(content).digest()
        assert await store.content("file-big") == content
        # Written a piece at a time too: the value as one SELECT reads it.
        row = await jobs.database.fetchone(
            "SELECT body FROM file_contents WHERE file_id = ?", ("file-big",)
        )
        assert row is not None and row[0] == content
        assert await store.content("file-empty") == b""
        assert await store.content_pieces("file-empty") == []
        assert await store.content("file-none") is None
        assert await store.content_pieces("file-none") is None
    finally:
        await jobs.close()


async def _exchange(
    app: ASGIApp, method: str, path: str, body: bytes = b"", content_type: bytes = b""
) -> list[Message]:
    """One request to ``app`` as app alice; the messages it sent back."""
    sent: list[Message] = []
    requested = False
    answered = trio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    headers = [(b"host", b"127.0.0.1"), (b"authorization", b"Bearer sk-alice")]
    if body:
        headers += [(b"content-length", str(len(body)).encode())]
    if content_type:
        headers += [(b"content-type", content_type)]
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 8080),
        "state": {},
        "extensions": {},
    }
    await app(scope, receive, send)
    return sent


def _app(batches: Batches) -> ASGIApp:
    engine = batches.jobs.engine
    assert isinstance(engine, Engine)
    parts = Parts(config=batches.config, engine=engine, batches=batches)
    return cast(ASGIApp, create_control_app(parts))


async def test_a_large_file_is_downloaded_in_several_writes(tmp_path: Path) -> None:
    content = os.urandom(SIZE)
    with trio.fail_after(30):
        async with yard(tmp_path, FakeUpstream()) as batches:
            await _store_file(batches.store, content)
            sent = await _exchange(_app(batches), "GET", "/v1/files/file-big/content")
    start, *bodies = sent
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-length", str(SIZE).encode()) in start["headers"]
    pieces = [m["body"] for m in bodies if m["body"]]
    assert len(pieces) == 3, [len(piece) for piece in pieces]
    assert hashlib.sha256(b"".join(pieces)).digest() == hashlib.sha256(content).digest()


async def test_a_large_upload_is_stored_byte_identical(tmp_path: Path) -> None:
    content = b'{"custom_id": "x"}\n' + os.urandom(SIZE)
    form = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n" + content + b"\r\n--b--\r\n"
    )
    with trio.fail_after(30):
        async with yard(tmp_path, FakeUpstream()) as batches:
            sent = await _exchange(
                _app(batches), "POST", "/v1/files", form, b"multipart/form-data; boundary=b"
            )
            assert sent[0]["status"] == 200, sent
            file_id = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["id"]
            stored = await batches.store.content(file_id)
    assert stored is not None
    assert hashlib.sha256(stored).digest() == hashlib.sha256(content).digest()
