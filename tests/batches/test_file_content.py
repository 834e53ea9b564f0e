"""A stored file is written and read back a piece at a time, byte for byte:
by the store (``content_pieces``, ``content``) and by ``GET
/v1/files/ID/content``, which sends it as several writes, not one body of
the whole file."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tracemalloc
from pathlib import Path

import httpx
import pytest
import trio

from tests.batches.helpers import control_app, exchange, streamed
from tests.batches.virtual import yard
from yard.batches.store import STREAM_PIECES, BatchStore, FileGone
from yard.db import BLOB_PIECE
from yard.h1.asgi import Message, ResponseCut
from yard.h1.server import serve
from yard.jobs.store import JobStore
from yard.testing.upstream import FakeUpstream

SIZE = STREAM_PIECES * BLOB_PIECE + 2 * BLOB_PIECE + 7
"""More pieces than a download reads at once, the last one short."""


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
    content = os.urandom(3 * BLOB_PIECE + 7)
    jobs = await JobStore.open(tmp_path / "jobs.sqlite")
    try:
        store = BatchStore(jobs)
        await _store_file(store, content)
        await _store_file(store, b"", "file-empty")
        await _store_file(store, b"x" * BLOB_PIECE, "file-one")
        for at_once in (1, 2, 4, STREAM_PIECES):
            pieces = await streamed(store, "file-big", at_once)
            assert pieces is not None
            assert [len(piece) for piece in pieces] == [BLOB_PIECE] * 3 + [7]
            assert hashlib.sha256(b"".join(pieces)).digest() == hashlib.sha256(content).digest()
        assert await store.content("file-big") == content
        # Written a piece at a time too: the value as one SELECT reads it.
        row = await jobs.database.fetchone(
            "SELECT body FROM file_contents WHERE file_id = ?", ("file-big",)
        )
        assert row is not None and row[0] == content
        assert await store.content("file-empty") == b""
        assert await streamed(store, "file-empty", 1) == []
        assert await store.content("file-one") == b"x" * BLOB_PIECE
        assert await streamed(store, "file-one", 1) == [b"x" * BLOB_PIECE]
        assert await store.content("file-none") is None
        assert await streamed(store, "file-none", 1) is None
    finally:
        await jobs.close()


async def test_a_stream_reads_the_next_pieces_only_once_the_last_are_taken(
    tmp_path: Path,
) -> None:
    # Deleting the file shows what was read already: those pieces still
    # come; the next read finds the file gone.
    content = os.urandom(3 * BLOB_PIECE + 7)
    jobs = await JobStore.open(tmp_path / "jobs.sqlite")
    try:
        store = BatchStore(jobs)
        await _store_file(store, content)
        stream = await store.content_stream("file-big", pieces_at_once=2)
        assert stream is not None and stream.length == len(content)
        first = await anext(stream.pieces)
        assert await store.delete_file("file-big")
        second = await anext(stream.pieces)
        assert first + second == content[: 2 * BLOB_PIECE]
        with pytest.raises(FileGone, match="'file-big' was deleted while it was read"):
            await anext(stream.pieces)
    finally:
        await jobs.close()


async def test_a_stream_half_read_keeps_no_snapshot_that_stops_a_checkpoint(
    tmp_path: Path,
) -> None:
    # A client that stops reading must not pin the WAL: between two reads the
    # stream holds no read transaction, so a full checkpoint completes.
    jobs = await JobStore.open(tmp_path / "jobs.sqlite")
    try:
        store = BatchStore(jobs)
        await _store_file(store, os.urandom(3 * BLOB_PIECE))
        stream = await store.content_stream("file-big", pieces_at_once=1)
        assert stream is not None
        await anext(stream.pieces)
        await _store_file(store, b"more", "file-other")
        with trio.fail_after(5):
            busy, _, _ = await jobs.database.fetchone("PRAGMA wal_checkpoint(TRUNCATE)") or (1,)
        assert busy == 0
        assert len(b"".join([piece async for piece in stream.pieces])) == 2 * BLOB_PIECE
    finally:
        await jobs.close()


async def test_a_stream_holds_one_read_of_pieces_at_a_time(tmp_path: Path) -> None:
    # Each piece let go of once taken, the next read's pieces are all a
    # stream holds: two pieces at most here, never the file's six.
    jobs = await JobStore.open(tmp_path / "jobs.sqlite")
    try:
        store = BatchStore(jobs)
        await _store_file(store, os.urandom(6 * BLOB_PIECE))
        tracemalloc.start()
        try:
            stream = await store.content_stream("file-big", pieces_at_once=2)
            assert stream is not None
            taken = 0
            async for piece in stream.pieces:
                taken += len(piece)
                del piece
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        await jobs.close()
    assert taken == 6 * BLOB_PIECE
    assert 2 * BLOB_PIECE <= peak < 2.5 * BLOB_PIECE


async def test_a_large_file_is_downloaded_a_piece_a_write(tmp_path: Path) -> None:
    content = os.urandom(SIZE)
    with trio.fail_after(30):
        async with yard(tmp_path, FakeUpstream()) as batches:
            await _store_file(batches.store, content)
            sent = await exchange(control_app(batches), "GET", "/v1/files/file-big/content")
    start, *bodies = sent
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-length", str(SIZE).encode()) in start["headers"]
    pieces = [m["body"] for m in bodies if m["body"]]
    assert [len(piece) for piece in pieces] == [BLOB_PIECE] * (STREAM_PIECES + 2) + [7]
    assert hashlib.sha256(b"".join(pieces)).digest() == hashlib.sha256(content).digest()
    assert not bodies[-1].get("more_body")


async def test_a_download_starts_before_the_file_is_read_and_ends_short_if_it_is_deleted(
    tmp_path: Path,
) -> None:
    # The file is deleted as its first piece goes out: a download that read
    # the whole file first would still send it all. This one had read only
    # its first pieces, so it raises ResponseCut out of the app, which the server turns
    # into a connection closed short of the Content-Length (never an end of
    # the body that would make the short file look complete).
    content = os.urandom(SIZE)
    sent: list[Message] = []
    with trio.fail_after(30):
        async with yard(tmp_path, FakeUpstream()) as batches:
            await _store_file(batches.store, content)

            async def delete_once(message: Message) -> None:
                if len(sent) == 2:
                    assert await batches.store.delete_file("file-big")

            with pytest.RaisesGroup(
                pytest.RaisesExc(ResponseCut, match="'file-big' was deleted while it was read"),
                allow_unwrapped=True,
                flatten_subgroups=True,
            ):
                await exchange(
                    control_app(batches),
                    "GET",
                    "/v1/files/file-big/content",
                    sent=sent,
                    on_body=delete_once,
                )
    start, *bodies = sent
    assert start["status"] == 200
    assert (b"content-length", str(SIZE).encode()) in start["headers"]
    received = b"".join(m["body"] for m in bodies)
    assert received == content[: STREAM_PIECES * BLOB_PIECE]
    assert all(m["more_body"] for m in bodies)


async def test_a_large_upload_is_stored_byte_identical(tmp_path: Path) -> None:
    content = b'{"custom_id": "x"}\n' + os.urandom(2 * BLOB_PIECE + 7)
    form = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n" + content + b"\r\n--b--\r\n"
    )
    with trio.fail_after(30):
        async with yard(tmp_path, FakeUpstream()) as batches:
            sent = await exchange(
                control_app(batches), "POST", "/v1/files", form, b"multipart/form-data; boundary=b"
            )
            assert sent[0]["status"] == 200, sent
            file_id = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["id"]
            stored = await batches.store.content(file_id)
    assert stored is not None
    assert hashlib.sha256(stored).digest() == hashlib.sha256(content).digest()


@pytest.mark.slow
async def test_a_client_sees_a_download_cut_short_by_a_deletion_as_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # On yard's HTTP server, over loopback, with httpx: the Content-Length
    # went out first, so the connection closed early is an error to the
    # client, not a complete file. Four reads' worth, more than the socket
    # buffers hold, so the deletion comes while later pieces are unread.
    content = os.urandom(4 * STREAM_PIECES * BLOB_PIECE + 7)
    with trio.fail_after(60):
        async with yard(tmp_path, FakeUpstream()) as batches, trio.open_nursery() as nursery:
            await _store_file(batches.store, content)
            (url,) = await nursery.start(serve, control_app(batches), "127.0.0.1", 0)
            received = bytearray()
            async with (
                httpx.AsyncClient(base_url=url) as client,
                client.stream(
                    "GET",
                    "/v1/files/file-big/content",
                    headers={"authorization": "Bearer sk-alice"},
                ) as response,
            ):
                assert response.status_code == 200
                assert response.headers["content-length"] == str(len(content))
                chunks = response.aiter_raw()
                received += await anext(chunks)
                assert await batches.store.delete_file("file-big")
                with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
                    async for chunk in chunks:
                        received += chunk
            nursery.cancel_scope.cancel()
    assert 0 < len(received) < len(content)
    assert received == content[: len(received)]
    # yard logs why, as one warning: the client's deletion is no fault of yard's.
    cut = [r for r in caplog.records if "ended short" in r.getMessage()]
    assert [(r.levelname, r.exc_info) for r in cut] == [("WARNING", None)]
    assert "file 'file-big' was deleted while it was read" in cut[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
