"""The batch service of two nodes on one real PostgreSQL, without engines:
the lines' jobs are claimed and ended here by hand, as a node would. One
driver per batch (a node that finds another drives its batch stops), and a
cancel made on the other node."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from tests.batches.helpers import chat_line, control_app, exchange, jsonl, stored_lines
from yard.batches.records import BatchRecord
from yard.batches.service import Batches
from yard.batches.store import STREAM_PIECES
from yard.cluster.batches import ClusterBatchStore
from yard.cluster.jobs import ClusterJobStore, SharedQueue
from yard.cluster.pg import PgDatabase
from yard.cluster.registry import NodeState, Registry
from yard.cluster.schema import MIGRATIONS
from yard.config import load_config
from yard.config.loader import local_app
from yard.db import BLOB_PIECE
from yard.jobs.records import StoredResult
from yard.jobs.service import Jobs
from yard.testing.engine import FakeEngine

HEARTBEAT_S = 0.1


def never_enqueued(request_id: str) -> None:
    """The engine's on_submit on a node that claims every job in these tests."""
    raise AssertionError("a batch line is claimed from the shared queue, never enqueued")


Start = Callable[[str], Awaitable[Batches]]


@pytest.fixture
async def nodes(postgres_dsn: str, tmp_path: Path) -> AsyncIterator[Start]:
    """Starts the batch service of a node (up in the registry) on one database."""
    async with AsyncExitStack() as stack, trio.open_nursery() as nursery:

        async def start(name: str) -> Batches:
            path = tmp_path / f"{name}.toml"
            path.write_text(
                f'[cluster]\ndatabase = "{postgres_dsn}"\nnode = "{name}"\n'
                f"heartbeat_s = {HEARTBEAT_S}\n\n"
                '[backends.llm]\ncommand = ["true"]\nmodels = ["tiny"]\nslots = 1\n'
            )
            config = load_config(path)
            db = await PgDatabase.open(postgres_dsn, MIGRATIONS, application_name=name)
            stack.push_async_callback(db.close)
            now = time.time()
            await Registry(db).publish(
                NodeState(name=name, url=f"http://{name}", heartbeat_at=now, started_at=now)
            )
            store = ClusterJobStore(db, node=name, aging_rate=config.scheduler.aging_rate)
            # No listener here: a wait re-reads the store often.
            queue = SharedQueue(lambda job_id: store.release(job_id, name), recheck_s=0.05)
            jobs = Jobs(
                engine=FakeEngine(on_submit=never_enqueued),
                store=store,
                config=config.jobs,
                queue=queue,
            )
            batches = Batches(jobs=jobs, config=config, store=ClusterBatchStore(store))
            await nursery.start(jobs.run)
            stack.push_async_callback(jobs.stop)
            await nursery.start(batches.run)
            stack.push_async_callback(batches.stop)
            return batches

        with trio.fail_after(30):
            yield start
        nursery.cancel_scope.cancel()


async def _create(node: Batches, lines: int) -> BatchRecord:
    app = node._app("")
    assert app is not None
    content = jsonl([chat_line(f"c{i}") for i in range(lines)])
    source = await node.upload(app=app.name, purpose="batch", filename="in", content=content)
    return await node.create(
        app=app,
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=None,
        rerun_safe=False,
    )


async def _until(node: Batches, batch_id: str, *statuses: str) -> BatchRecord:
    while True:
        batch = await node.get(batch_id, app=None)
        if batch.status in statuses:
            return batch
        await trio.sleep(0.02)


async def _jobs_of(node: Batches, batch_id: str, count: int) -> list[str]:
    """The job ids of the batch's lines, once ``count`` of them are jobs."""
    while True:
        ids = [line.job_id for line in await stored_lines(node.store, batch_id) if line.job_id]
        if len(ids) >= count:
            return ids
        await trio.sleep(0.02)


async def _handed_over(batch_id: str, old: Batches, new: Batches) -> None:
    while True:
        if batch_id not in old._drivers and batch_id in new._drivers:
            return
        await trio.sleep(0.02)


async def _serve(node: Batches, job_id: str) -> None:
    """Claim, run and finish a job as a node serving it would."""
    store = node.jobs.store
    assert isinstance(store, ClusterJobStore)
    claimed = await store.claim(store.node, ["llm"])
    assert claimed is not None and claimed.id == job_id
    assert await store.mark_running(job_id, at=time.time(), queued_s=0.0)
    body = b'{"choices": [{"message": {"content": "hi"}}]}'
    result = StoredResult(status=200, headers=((b"content-type", b"application/json"),), body=body)
    assert await store.finish(job_id, "succeeded", at=time.time(), result=result)


async def test_a_node_stops_driving_a_batch_another_node_has_taken_over(nodes: Start) -> None:
    a, b = await nodes("a"), await nodes("b")
    batch = await _create(a, 3)
    # One line per slot until a run there has been measured.
    (first,) = await _jobs_of(a, batch.id, 1)
    assert set(a._drivers) == {batch.id} and not b._drivers
    await _serve(b, first)
    rest = (await _jobs_of(a, batch.id, 3))[1:]
    # a is declared gone while it is alive: b adopts the batch, and a, which
    # finds it is no longer its driver, stops driving it.
    assert isinstance(a.store, ClusterBatchStore)
    assert await Registry(a.store.jobs.database).mark_gone("a")
    await _handed_over(batch.id, a, b)
    for job_id in rest:
        await _serve(a, job_id)  # any node serves the lines
    ended = await _until(b, batch.id, "completed")
    assert (ended.total, ended.completed, ended.failed) == (3, 3, 0)
    output = await b.store.content(ended.output_file_id or "")
    assert output is not None
    assert sorted(line.split(b'"custom_id": ')[1][:4] for line in output.splitlines()) == [
        b'"c0"',
        b'"c1"',
        b'"c2"',
    ]


async def test_a_batch_cancelled_on_another_node_ends_its_waiting_lines_as_batch_cancelled(
    nodes: Start,
) -> None:
    a, b = await nodes("a"), await nodes("b")
    batch = await _create(a, 3)
    (first,) = await _jobs_of(a, batch.id, 1)
    await _serve(a, first)
    await _jobs_of(a, batch.id, 3)
    cancelling = await b.cancel(batch.id, app=None)
    assert cancelling.status in ("cancelling", "cancelled")
    ended = await _until(a, batch.id, "cancelled")
    assert (ended.total, ended.completed, ended.failed) == (3, 1, 2)
    errors = await a.store.content(ended.error_file_id or "")
    assert errors is not None and errors.count(b"batch_cancelled") == 2
    assert b'"code": "cancelled"' not in errors


async def test_a_node_that_stops_gives_its_batch_to_another_at_once(nodes: Start) -> None:
    a, b = await nodes("a"), await nodes("b")
    batch = await _create(a, 2)
    (first,) = await _jobs_of(a, batch.id, 1)
    # a stops (still up in the registry, as until its node leaves): b adopts
    # the batch at its next look around, without waiting for a to be gone.
    await a.stop()
    assert not a._drivers
    await _handed_over(batch.id, a, b)
    await _serve(b, first)
    (second,) = (await _jobs_of(b, batch.id, 2))[1:]
    await _serve(b, second)
    ended = await _until(b, batch.id, "completed")
    assert (ended.total, ended.completed, ended.failed) == (2, 2, 0)


async def test_a_file_stored_by_one_node_downloads_from_another_byte_identical(
    nodes: Start,
) -> None:
    # GET /v1/files/ID/content on PostgreSQL: more reads than one, each its
    # own transaction, the head with the whole length before the first.
    a, b = await nodes("a"), await nodes("b")
    content = os.urandom(2 * STREAM_PIECES * BLOB_PIECE + 5)
    for file_id, stored in (("file-big", content), ("file-empty", b"")):
        await a.store.add_file(
            file_id=file_id,
            app=local_app(a.config).name,
            purpose="batch_output",
            filename="out.jsonl",
            content=stored,
            created_at=1.0,
        )
    for file_id, stored in (("file-big", content), ("file-empty", b"")):
        start, *bodies = await exchange(
            control_app(b), "GET", f"/v1/files/{file_id}/content", key=None
        )
        assert start["status"] == 200, bodies
        assert (b"content-length", str(len(stored)).encode()) in start["headers"]
        received = b"".join(m["body"] for m in bodies)
        assert hashlib.sha256(received).digest() == hashlib.sha256(stored).digest()
        assert not bodies[-1]["more_body"]
