"""Helpers for the Batch API tests: input lines, and polling a batch."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from yard.batches.records import LineRecord
from yard.batches.rows import LINE_COLUMNS, line_from_row
from yard.batches.store import STREAM_PIECES, BatchStore

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
