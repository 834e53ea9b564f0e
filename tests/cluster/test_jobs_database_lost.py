"""The job service of a cluster node (on a :class:`SharedQueue`) when the shared
database goes away around a job's start: a job that was marked running needs
the database no more until its end, which is kept and written once the
database is back; a job that could not be marked running is given back.

The store is SQLite with a switch that makes every call fail as a lost
PostgreSQL does (:class:`yard.cluster.pg.DatabaseLost`), flipped at exact
points; the clock is virtual. The same loss with real processes and a real
PostgreSQL is ``test_nodes_lost.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.jobs.harness import EPOCH, proxy_request, wall
from yard.cluster.jobs import SharedQueue
from yard.cluster.pg import DatabaseLost
from yard.errors import Rejected
from yard.jobs.records import JobError, JobRecord, Status, StoredRequest, StoredResult
from yard.jobs.service import Jobs
from yard.jobs.store import JobStore
from yard.testing.engine import FakeEngine
from yard.testing.upstream import Answer, FakeUpstream


class LosingStore(JobStore):
    """A job store whose database can be lost: while :attr:`lost`, every call
    the job service makes raises :class:`DatabaseLost`. With
    :attr:`lose_once_running`, it is lost the moment a job has been marked
    running (that call itself succeeds): the tightest form of a database
    stopped right after a client saw the job running."""

    lost = False
    lose_once_running = False
    cancel_before_start = False

    def _check(self) -> None:
        if self.lost:
            raise DatabaseLost("cannot reach PostgreSQL (the test stopped it)")

    async def mark_running(self, job_id: str, *, at: float, queued_s: float) -> bool:
        self._check()
        started = await super().mark_running(job_id, at=at, queued_s=queued_s)
        if self.lose_once_running:
            self.lost = True
        return started

    async def request(self, job_id: str) -> StoredRequest | None:
        self._check()
        if self.cancel_before_start:
            # A client's cancel lands between the dispatch and the start.
            error = JobError(code="cancelled", message="the job was cancelled", status=499)
            assert await super().finish(job_id, "cancelled", at=wall(), error=error)
        return await super().request(job_id)

    async def finish(
        self,
        job_id: str,
        status: Status,
        *,
        at: float,
        error: JobError | None = None,
        result: StoredResult | None = None,
    ) -> bool:
        self._check()
        return await super().finish(job_id, status, at=at, error=error, result=result)

    async def mark_requeue_spent(self, job_id: str) -> None:
        self._check()
        await super().mark_requeue_spent(job_id)

    async def mark_requeued(self, job_id: str) -> bool:
        self._check()
        return await super().mark_requeued(job_id)

    async def get(self, job_id: str) -> JobRecord | None:
        self._check()
        return await super().get(job_id)

    async def insert(self, **job: Any) -> JobRecord:
        self._check()
        return await super().insert(**job)

    async def expire(self, *, finished_before: float) -> list[str]:
        self._check()
        return await super().expire(finished_before=finished_before)

    async def purge(self, *, finished_before: float) -> int:
        self._check()
        return await super().purge(finished_before=finished_before)


class Released:
    """The node's ``release`` (give a claimed job back to the shared queue),
    recording its calls; it needs the database too."""

    def __init__(self, store: LosingStore) -> None:
        self.store = store
        self.ids: list[str] = []

    async def __call__(self, job_id: str) -> bool:
        self.store._check()
        self.ids.append(job_id)
        return True


@asynccontextmanager
async def node_jobs(
    path: Path,
    engine: FakeEngine,
    upstream: FakeUpstream,
    *,
    store_type: type[LosingStore] = LosingStore,
) -> AsyncIterator[tuple[Jobs, LosingStore, Released]]:
    """A started job service of a cluster node on a :class:`LosingStore`
    (or the subclass ``store_type``)."""
    store = store_type((await JobStore.open(path, threaded=False)).database)
    released = Released(store)
    jobs = Jobs(
        engine=engine, store=store, upstream=upstream, wall=wall, queue=SharedQueue(released)
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(jobs.run)
            yield jobs, store, released
            nursery.cancel_scope.cancel()
    finally:
        await store.close()


async def _claimed(jobs: Jobs, store: LosingStore) -> str:
    """Hand a job in and put it in this node's queue, as a claim does."""
    job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
    job = await store.get(job_id)
    assert job is not None
    jobs.enqueue(job, arrived_at_wall=job.created_at)
    return job_id


async def test_a_job_marked_running_as_the_database_is_lost_runs_and_its_end_is_written_later(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(chunks=[b'{"ok": true}'], delay=2.0))
    async with node_jobs(tmp_path / "jobs.sqlite", engine, upstream) as (jobs, store, _):
        job_id = await _claimed(jobs, store)
        await trio.sleep(1.0)
        store.lose_once_running = True
        engine.dispatch(job_id)
        # Running (on disk) when the database goes; the backend answers at 3 s.
        await trio.sleep(4.0)
        assert store.lost
        assert len(upstream.calls) == 1
        assert jobs.unwritten == 1
        store.lost = False
        store.lose_once_running = False
        await trio.sleep(2 * Jobs.RETRY_S)
        assert jobs.unwritten == 0
        job = await store.get(job_id)
        result = await store.result(job_id)

    assert job is not None
    assert (job.status, job.error) == ("succeeded", None)
    # It ends as it did, when the backend answered, not when it was written.
    assert job.started_at == EPOCH + 1.0
    assert job.finished_at == EPOCH + 3.0
    assert result is not None and result.body == b'{"ok": true}'
    assert engine.admission(job_id).reports == [("ok", "")]
    assert "runner failed" not in caplog.text
    assert f"job {job_id}: cannot record its end" in caplog.text


async def test_a_job_dispatched_while_the_database_is_lost_is_given_back_unrun(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream()
    async with node_jobs(tmp_path / "jobs.sqlite", engine, upstream) as (jobs, store, released):
        job_id = await _claimed(jobs, store)
        store.lost = True
        engine.dispatch(job_id)
        await trio.sleep(3.0)
        assert released.ids == []
        store.lost = False
        await trio.sleep(2 * Jobs.RETRY_S)
        job = await store.get(job_id)

    assert released.ids == [job_id]
    assert upstream.calls == []
    assert job is not None and job.status == "queued" and job.started_at is None
    assert engine.admission(job_id).cancelled
    assert "runner failed" not in caplog.text


async def test_a_job_cancelled_as_it_is_dispatched_does_not_run(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream()
    async with node_jobs(tmp_path / "jobs.sqlite", engine, upstream) as (jobs, store, released):
        job_id = await _claimed(jobs, store)
        store.cancel_before_start = True
        engine.dispatch(job_id)
        await trio.sleep(1.0)
        job = await store.get(job_id)

    assert upstream.calls == []
    assert released.ids == []
    assert job is not None and job.status == "cancelled" and job.started_at is None
    assert engine.admission(job_id).cancelled


async def test_a_job_handed_in_while_the_database_is_lost_is_refused_with_503_and_retry_after(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Before: DatabaseLost went up through the gateway as 500 internal_error.
    async with node_jobs(tmp_path / "jobs.sqlite", FakeEngine(), FakeUpstream()) as (
        jobs,
        store,
        _,
    ):
        store.lost = True
        with pytest.raises(Rejected) as refused:
            await jobs.submit(proxy_request(), rerun_safe=False)
        store.lost = False
        assert await store.counts() == dict.fromkeys(await store.counts(), 0)
    assert (refused.value.status, refused.value.code) == (503, "database_unavailable")
    assert refused.value.retry_after_s == 2.0
    assert "nothing was stored" in refused.value.message


async def test_a_job_read_while_the_database_is_lost_answers_what_this_node_knows(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(delay=10.0))
    async with node_jobs(tmp_path / "jobs.sqlite", engine, upstream) as (jobs, store, _):
        job_id = await _claimed(jobs, store)
        engine.dispatch(job_id)
        await trio.sleep(1.0)
        store.lost = True
        held = await jobs.get(job_id, app=None)
        # A job this node does not hold: refused as JSON, with when to retry.
        with pytest.raises(Rejected) as refused:
            await jobs.get("job_elsewhere", app=None)
        store.lost = False
    assert held.id == job_id and held.status == "running"
    assert "the database cannot be reached now" in held.notes[-1]
    assert (refused.value.status, refused.value.code) == (503, "database_unavailable")
