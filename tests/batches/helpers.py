"""Helpers for the Batch API tests: input lines, and polling a batch."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httpx
import trio

from yard.app.web import Parts, create_control_app
from yard.batches.records import LineRecord
from yard.batches.rows import LINE_COLUMNS, line_from_row
from yard.batches.service import Batches
from yard.batches.store import STREAM_PIECES, BatchStore
from yard.engine import Engine
from yard.h1.asgi import ASGIApp, Message

ENDPOINT = "/v1/chat/completions"


def chat_line(custom_id: str, model: str = "tiny", content: str = "hi") -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": ENDPOINT,
        "body": {"model": model, "messages": [{"role": "user", "content": content}]},
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


async def upload(client: httpx.AsyncClient, content: bytes, name: str = "in.jsonl") -> str:
    response = await client.post(
        "/v1/files",
        files={"file": (name, content, "application/jsonl")},
        data={"purpose": "batch"},
    )
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def create(
    client: httpx.AsyncClient, file_id: str, *, window: str = "24h", **extra: Any
) -> dict[str, Any]:
    response = await client.post(
        "/v1/batches",
        json={
            "input_file_id": file_id,
            "endpoint": ENDPOINT,
            "completion_window": window,
            **extra,
        },
    )
    assert response.status_code == 200, response.text
    batch: dict[str, Any] = response.json()
    return batch


async def until_ended(client: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    """Poll the batch until it has ended; the caller bounds the wait."""
    while True:
        batch: dict[str, Any] = (await client.get(f"/v1/batches/{batch_id}")).json()
        if batch["status"] in ("completed", "failed", "expired", "cancelled"):
            return batch
        await trio.sleep(0.05)


async def lines_of(client: httpx.AsyncClient, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    response = await client.get(f"/v1/files/{file_id}/content")
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.content.splitlines()]


async def stored_lines(store: BatchStore, batch_id: str) -> list[LineRecord]:
    """A batch's lines as its store keeps them, in submission order (without
    bodies): what a test looks at; yard itself reads them a page at a time."""
    rows = await store.jobs.database.fetchall(
        f"SELECT {LINE_COLUMNS} FROM batch_lines WHERE batch_id = ? ORDER BY idx", (batch_id,)
    )
    return [line_from_row(row) for row in rows]


async def streamed(
    store: BatchStore, file_id: str, pieces_at_once: int = STREAM_PIECES
) -> list[bytes] | None:
    """Every piece of a stored file as :meth:`BatchStore.content_stream`
    gives them (None: no such file), checked against the stream's length."""
    stream = await store.content_stream(file_id, pieces_at_once=pieces_at_once)
    if stream is None:
        return None
    pieces = [piece async for piece in stream.pieces]
    assert sum(len(piece) for piece in pieces) == stream.length
    return pieces


async def exchange(
    app: ASGIApp,
    method: str,
    path: str,
    body: bytes = b"",
    content_type: bytes = b"",
    sent: list[Message] | None = None,
    on_body: Callable[[Message], Awaitable[None]] | None = None,
    key: str | None = "sk-alice",
) -> list[Message]:
    """One request to ``app`` with ``key`` (app alice's by default; None:
    none) from 127.0.0.1; the messages it sent back (into ``sent`` as they
    come, if given). ``on_body`` is awaited on each body message before it
    is taken."""
    sent = [] if sent is None else sent
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
        if on_body is not None and message["type"] == "http.response.body":
            await on_body(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    headers = [(b"host", b"127.0.0.1")]
    if key is not None:
        headers += [(b"authorization", f"Bearer {key}".encode())]
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


def control_app(batches: Batches) -> ASGIApp:
    """The control plane's Quart app serving ``batches`` (its engine, real
    or fake, only looked at)."""
    parts = Parts(config=batches.config, engine=cast(Engine, batches.jobs.engine), batches=batches)
    return cast(ASGIApp, create_control_app(parts))
