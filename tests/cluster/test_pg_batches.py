"""ClusterBatchStore against a real PostgreSQL: files and batches any node reads,
lines that become jobs of the shared queue once, one driver per batch."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.batches.helpers import stored_lines, streamed
from yard.batches.records import BatchError, ParsedLine
from yard.batches.store import STREAM_PIECES, FileGone, FileLimit
from yard.cluster.batches import ClusterBatchStore
from yard.cluster.jobs import ClusterJobStore, rank_of
from yard.cluster.pg import PgDatabase
from yard.cluster.registry import NodeState, Registry
from yard.cluster.schema import MIGRATIONS
from yard.db import BLOB_PIECE
from yard.jobs.records import StoredResult
from yard.testing.payloads import batch_jsonl

Stores = Callable[[str], Awaitable[ClusterBatchStore]]
AGING = 0.1


@pytest.fixture
async def stores(postgres_dsn: str) -> AsyncIterator[Stores]:
    """Opens the batch store of a node (its own connections) on one database."""
    opened: list[PgDatabase] = []

    async def open_store(node: str) -> ClusterBatchStore:
        db = await PgDatabase.open(postgres_dsn, MIGRATIONS, application_name=node)
        opened.append(db)
        return ClusterBatchStore(ClusterJobStore(db, node=node, aging_rate=AGING))

    try:
        yield open_store
    finally:
        for db in opened:
            await db.close()


async def _up(store: ClusterBatchStore, *names: str) -> Registry:
    registry = Registry(store.jobs.database)
    for name in names:
        await registry.publish(
            NodeState(name=name, url=f"http://{name}", heartbeat_at=1.0, started_at=1.0)
        )
    return registry


async def _batch(store: ClusterBatchStore, batch_id: str = "batch_1", lines: int = 2) -> None:
    await store.add_file(
        file_id="file-in",
        app="app",
        purpose="batch",
        filename="in.jsonl",
        content=b"x",
        created_at=10.0,
    )
    await store.add_batch(
        batch_id=batch_id,
        app="app",
        endpoint="/v1/chat/completions",
        input_file_id="file-in",
        completion_window="24h",
        metadata={"k": "v"},
        priority=5.0,
        rerun_safe=False,
        created_at=10.0,
        expires_at=10.0 + 86400,
    )
    parsed = [
        ParsedLine(
            line=i + 1,
            custom_id=f"c{i}",
            model="m",
            backend="chat",
            url="/v1/chat/completions",
            body=b'{"model": "m", "n": %d}' % i,
        )
        for i in range(lines)
    ]
    assert await store.start(batch_id, parsed, at=11.0)


async def test_a_file_of_several_pieces_is_read_back_a_piece_at_a_time(stores: Stores) -> None:
    # Compressible and not: PostgreSQL compresses the one, slices the other.
    content = os.urandom(BLOB_PIECE) + b"line\n" * (BLOB_PIECE // 5) + b"end"
    a, b = await stores("a"), await stores("b")
    for file_id, stored in (("file-big", content), ("file-empty", b""), ("file-one", b"x")):
        await a.add_file(
            file_id=file_id,
            app="app",
            purpose="batch_output",
            filename="out.jsonl",
            content=stored,
            created_at=5.0,
        )
    for at_once in (1, 2, STREAM_PIECES):
        pieces = await streamed(b, "file-big", at_once)
        assert pieces is not None
        assert [len(piece) for piece in pieces] == [
            BLOB_PIECE,
            BLOB_PIECE,
            len(content) % BLOB_PIECE,
        ]
        assert hashlib.sha256(b"".join(pieces)).digest() == hashlib.sha256(content).digest()
    assert await b.content("file-big") == content
    assert await streamed(b, "file-empty") == [] and await b.content("file-empty") == b""
    assert await streamed(b, "file-one") == [b"x"] and await b.content("file-one") == b"x"
    assert await streamed(b, "file-none") is None and await b.content("file-none") is None


async def test_a_stream_reads_each_few_pieces_in_a_transaction_of_its_own(
    stores: Stores,
) -> None:
    # Between two reads the stream holds no transaction (a snapshot would
    # still show the file): the file deleted on another node is gone for
    # the next read, and the pieces read before it were the file's.
    content = os.urandom(3 * BLOB_PIECE + 7)
    a, b = await stores("a"), await stores("b")
    await a.add_file(
        file_id="file-big",
        app="app",
        purpose="batch_output",
        filename="out.jsonl",
        content=content,
        created_at=5.0,
    )
    stream = await b.content_stream("file-big", pieces_at_once=2)
    assert stream is not None and stream.length == len(content)
    first = await anext(stream.pieces)
    assert await a.delete_file("file-big")
    second = await anext(stream.pieces)
    assert first + second == content[: 2 * BLOB_PIECE]
    with pytest.raises(FileGone, match="'file-big' was deleted while it was read"):
        await anext(stream.pieces)


async def _compressed(db: PgDatabase) -> set[str]:
    """The files whose contents PostgreSQL keeps compressed."""
    rows = await db.fetchall(
        "SELECT file_id FROM file_contents WHERE pg_column_compression(body) IS NOT NULL"
    )
    return {str(row[0]) for row in rows}


async def test_a_file_is_stored_uncompressed_so_a_piece_is_read_without_those_before(
    stores: Stores,
) -> None:
    # substring() of a compressed value decompresses it from its start: each
    # piece of a 200 MB JSONL file cost more than the one before (30 s for
    # the file). Of an uncompressed one it fetches only that piece's chunks.
    store = await stores("a")
    content = batch_jsonl(2 * BLOB_PIECE + 100)
    await store.add_file(
        file_id="file-jsonl",
        app="app",
        purpose="batch",
        filename="in.jsonl",
        content=content,
        created_at=5.0,
    )
    assert await _compressed(store.jobs.database) == set()
    assert await store.content("file-jsonl") == content


async def test_files_stored_compressed_by_an_older_yard_are_rewritten_and_read_identical(
    postgres_dsn: str,
) -> None:
    old = [m for m in MIGRATIONS if m.version <= 5]  # the schema before files were uncompressed
    contents = {
        "file-big": batch_jsonl(3 * BLOB_PIECE + 5),
        "file-small": b'{"a": 1}\n' * 300,  # compressed inline, under TOAST's threshold
        "file-random": os.urandom(BLOB_PIECE + 1),  # not compressible: stored as it is
        "file-empty": b"",
    }
    db = await PgDatabase.open(postgres_dsn, old, application_name="old")
    try:
        store = ClusterBatchStore(ClusterJobStore(db, node="old", aging_rate=AGING))
        for file_id, content in contents.items():
            await store.add_file(
                file_id=file_id,
                app="app",
                purpose="batch",
                filename="in.jsonl",
                content=content,
                created_at=5.0,
            )
        assert await _compressed(db) == {"file-big", "file-small"}
    finally:
        await db.close()

    db = await PgDatabase.open(postgres_dsn, MIGRATIONS, application_name="new")
    try:
        store = ClusterBatchStore(ClusterJobStore(db, node="new", aging_rate=AGING))
        assert await _compressed(db) == set()
        for file_id, content in contents.items():
            pieces = await streamed(store, file_id)
            assert pieces is not None
            assert hashlib.sha256(b"".join(pieces)).digest() == hashlib.sha256(content).digest()
            assert [len(p) for p in pieces][:-1] == [BLOB_PIECE] * (len(pieces) - 1)
    finally:
        await db.close()


async def test_a_file_uploaded_on_one_node_is_read_on_another(stores: Stores) -> None:
    a, b = await stores("a"), await stores("b")
    record = await a.add_file(
        file_id="file-1",
        app="app",
        purpose="batch",
        filename="in.jsonl",
        content=b"\x00line\n",
        created_at=5.0,
        max_files=1,
    )
    assert record.bytes == 6 and record.filename == "in.jsonl"
    assert await b.file("file-1") == record
    assert await b.content("file-1") == b"\x00line\n"
    listed = await b.list_files(app="app", purpose=None, limit=10, after_seq=None, ascending=True)
    assert listed == [record]
    with pytest.raises(FileLimit):
        await b.add_file(
            file_id="file-2",
            app="app",
            purpose="batch",
            filename="x",
            content=b"",
            created_at=6.0,
            max_files=1,
        )
    assert await b.delete_file("file-1")
    assert await a.file("file-1") is None and await a.content("file-1") is None
    assert not await a.delete_file("file-1")


async def test_a_line_becomes_one_claimable_job_and_its_outcome_is_written_once(
    stores: Stores,
) -> None:
    a, b = await stores("a"), await stores("b")
    await _batch(a)
    batch = await b.batch("batch_1")
    assert batch is not None and batch.status == "in_progress" and batch.total == 2
    assert batch.metadata == {"k": "v"}
    first, second = await stored_lines(a, "batch_1")
    job = await a.submit(
        first,
        job_id="job_1_0",
        app="app",
        priority=4.0,
        start_by=500.0,
        rerun_safe=False,
        created_at=20.0,
        path="/v1/chat/completions",
    )
    assert job is not None and job.status == "queued" and job.start_by == 500.0
    # Once only, whichever node (a second driver) tries again.
    again = await b.submit(
        first,
        job_id="job_1_0x",
        app="app",
        priority=4.0,
        start_by=500.0,
        rerun_safe=False,
        created_at=21.0,
        path="/v1/chat/completions",
    )
    assert again is None
    # Node b claims it from the shared queue, at its place in the one order.
    claimed = await b.jobs.claim("b", ["chat"])
    assert claimed is not None and claimed.id == "job_1_0"
    rank = await a.jobs.database.fetchone("SELECT rank, origin FROM jobs WHERE id = 'job_1_0'")
    assert rank == (rank_of(4.0, 20.0, AGING), "a")
    request = await b.jobs.request("job_1_0")
    assert request is not None and request.body == b'{"model": "m", "n": 0}'
    assert request.path == "/v1/chat/completions"
    assert await b.jobs.mark_running("job_1_0", at=22.0, queued_s=2.0)
    result = StoredResult(status=200, headers=((b"content-type", b"application/json"),), body=b"{}")
    assert await b.jobs.finish("job_1_0", "succeeded", at=23.0, result=result)
    assert await b.service_times("chat") == [1.0]
    (first,) = [line for line in await stored_lines(a, "batch_1") if line.idx == 0]
    assert first.job_id == "job_1_0"
    assert await a.record(first, outcome="ok", output='{"custom_id": "c0"}')
    assert not await b.record(first, outcome="error", output="late")
    assert await a.record(second, outcome="error", output='{"custom_id": "c1"}')
    assert await b.counts("batch_1") == (1, 1, 0)
    assert await a.mark_finalizing("batch_1", at=30.0)
    batch = await b.batch("batch_1")
    assert batch is not None
    assert await a.finish(
        batch, "completed", at=31.0, output_file_id="file-o", error_file_id="file-e"
    )
    assert not await b.finish(batch, "completed", at=32.0, output_file_id="f2", error_file_id="f3")
    done = await b.batch("batch_1")
    assert done is not None and done.status == "completed"
    assert (done.completed, done.failed, done.output_file_id) == (1, 1, "file-o")
    assert await b.content("file-o") == b'{"custom_id": "c0"}\n'
    assert await b.content("file-e") == b'{"custom_id": "c1"}\n'
    assert await stored_lines(a, "batch_1") == []


async def test_one_driver_until_it_is_gone_then_another_adopts(stores: Stores) -> None:
    a, b = await stores("a"), await stores("b")
    registry = await _up(a, "a", "b")
    await _batch(a)
    # Created on a: a drives it; b may not while a is up.
    assert await a.drives("batch_1")
    assert [x.id for x in await a.unended()] == ["batch_1"]
    assert await b.unended() == []
    assert not await b.adopt("batch_1")
    assert await a.adopt("batch_1")
    # a is declared gone: b takes it over, and a sees it no longer drives it.
    assert await registry.mark_gone("a")
    assert [x.id for x in await b.unended()] == ["batch_1"]
    assert await b.adopt("batch_1")
    assert not await a.drives("batch_1") and await b.drives("batch_1")
    assert not await a.adopt("batch_1")
    # A graceful stop gives it up for anyone.
    assert await b.release() == 1
    assert await a.adopt("batch_1")


async def test_a_batch_is_cancelled_from_another_node_and_ends_once(stores: Stores) -> None:
    a, b = await stores("a"), await stores("b")
    await _up(a, "a", "b")
    await _batch(a, lines=1)
    assert await b.mark_cancelling("batch_1", at=12.0)
    assert not await a.mark_cancelling("batch_1", at=13.0)
    batch = await a.batch("batch_1")
    assert batch is not None and batch.status == "cancelling"
    assert not await a.mark_finalizing("batch_1", at=14.0)
    assert await a.finish(batch, "cancelled", at=15.0, output_file_id="o", error_file_id="e")
    ended = await b.batch("batch_1")
    assert ended is not None and ended.status == "cancelled" and ended.cancelled_at == 15.0
    # An ended batch has no driver and cannot be adopted.
    assert not await b.adopt("batch_1") and await b.unended() == []


async def test_failed_validation_and_lists(stores: Stores) -> None:
    a, b = await stores("a"), await stores("b")
    await a.add_batch(
        batch_id="batch_x",
        app="app",
        endpoint="/v1/chat/completions",
        input_file_id="gone",
        completion_window="24h",
        metadata=None,
        priority=0.0,
        rerun_safe=True,
        created_at=1.0,
        expires_at=2.0,
    )
    await b.add_batch(
        batch_id="batch_y",
        app="other",
        endpoint="/v1/embeddings",
        input_file_id="gone",
        completion_window="1h",
        metadata=None,
        priority=0.0,
        rerun_safe=False,
        created_at=1.5,
        expires_at=2.0,
    )
    why = [BatchError(code="invalid_json", message="bad", line=3)]
    assert await b.fail("batch_x", why, at=3.0)
    assert not await a.fail("batch_x", why, at=4.0)
    failed = await a.batch("batch_x")
    assert failed is not None and failed.status == "failed" and failed.errors == tuple(why)
    assert failed.rerun_safe
    listed = await a.list_batches(app=None, limit=10, before_seq=None)
    assert [x.id for x in listed] == ["batch_y", "batch_x"]
    assert [x.id for x in await a.list_batches(app="app", limit=10, before_seq=None)] == ["batch_x"]
