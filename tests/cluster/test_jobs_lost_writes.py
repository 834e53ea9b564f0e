"""What a cluster node's job service (on a shared queue) does with a write
the shared database does not take: a lost (or busy) database is waited for,
with a bounded log; a refusal is logged once and not retried; and a job whose
backend connection broke while the database was away ends as the core
decides (its end written later), or goes back unrun, never as an internal
error.

The store is SQLite with switches that make calls fail as PostgreSQL does
(:mod:`tests.cluster.test_jobs_database_lost`); the clock is virtual and
every time asserted is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.cluster.test_jobs_database_lost import LosingStore, node_jobs
from tests.jobs.harness import EPOCH, proxy_request
from yard.cluster.pg import DatabaseBusy
from yard.db import DatabaseError
from yard.h1.upstream import UpstreamError
from yard.jobs.records import JobError, Status, StoredRequest, StoredResult
from yard.jobs.service import Jobs
from yard.testing.engine import FakeEngine
from yard.testing.upstream import Answer, FakeUpstream


class Logged(logging.Handler):
    """The job service's log lines about one job, with the virtual time of each."""

    def __init__(self, job_id: str) -> None:
        super().__init__(logging.DEBUG)
        self.job_id = job_id
        self.lines: list[tuple[float, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.job_id in message:
            self.lines.append((trio.current_time(), record.levelname, message))


@contextmanager
def logged(job_id: str) -> Iterator[Logged]:
    handler = Logged(job_id)
    logger = logging.getLogger("yard.jobs")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class RefusingStore(LosingStore):
    """Also refuses, for good, the next :attr:`refusals` ends (a constraint
    the row breaks, a bug in a statement), counting every call of finish."""

    refusals = 0
    finishes: list[tuple[float, Status, str | None]]

    async def finish(
        self,
        job_id: str,
        status: Status,
        *,
        at: float,
        error: JobError | None = None,
        result: StoredResult | None = None,
    ) -> bool:
        self.finishes.append((trio.current_time(), status, None if error is None else error.code))
        if self.refusals:
            self.refusals -= 1
            raise DatabaseError("PostgreSQL: value too long for type character varying(8)")
        return await super().finish(job_id, status, at=at, error=error, result=result)


async def _running(jobs: Jobs, store: LosingStore, engine: FakeEngine) -> str:
    """A job claimed here at 0 s and dispatched at 1 s (marked running)."""
    job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
    job = await store.get(job_id)
    assert job is not None
    jobs.enqueue(job, arrived_at_wall=job.created_at)
    await trio.sleep(1.0)
    engine.dispatch(job_id)
    return job_id


async def test_an_end_kept_while_the_database_is_lost_is_logged_once_a_minute_with_the_wait(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(delay=2.0))
    async with node_jobs(tmp_path / "jobs.sqlite", engine, upstream) as (jobs, store, _):
        store.lose_once_running = True
        job_id = await _running(jobs, store, engine)
        with logged(job_id) as log:
            # The backend answers at 3 s; the database is back at 150.5 s.
            await trio.sleep(149.5)
            assert jobs.unwritten == 1
            store.lost = False
            store.lose_once_running = False
            await trio.sleep(2.0)
            assert jobs.unwritten == 0
        job = await store.get(job_id)

    assert job is not None and job.status == "succeeded" and job.finished_at == EPOCH + 3.0
    times = [(at, level) for at, level, _ in log.lines]
    assert times == [(3.0, "WARNING"), (63.0, "WARNING"), (123.0, "WARNING"), (151.0, "INFO")]
    first, later, _, done = (message for _, _, message in log.lines)
    assert first.startswith(f"job {job_id}: cannot record its end now (cannot reach PostgreSQL")
    assert "retried every 1 s" in first
    assert later.startswith(f"job {job_id}: still cannot record its end after 60 s (cannot reach")
    assert done == f"job {job_id}: could record its end after 148 s (the database is back)"


async def test_a_busy_database_is_waited_for_like_a_lost_one(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    class BusyOnce(RefusingStore):
        async def finish(
            self,
            job_id: str,
            status: Status,
            *,
            at: float,
            error: JobError | None = None,
            result: StoredResult | None = None,
        ) -> bool:
            if not self.finishes:
                self.finishes.append((trio.current_time(), status, None))
                raise DatabaseBusy("PostgreSQL: canceling statement due to lock timeout")
            return await super().finish(job_id, status, at=at, error=error, result=result)

    engine = FakeEngine()
    upstream = FakeUpstream(Answer(delay=2.0))
    async with node_jobs(tmp_path / "jobs.sqlite", engine, upstream, store_type=BusyOnce) as (
        jobs,
        store,
        _,
    ):
        assert isinstance(store, BusyOnce)
        store.finishes = []
        job_id = await _running(jobs, store, engine)
        await trio.sleep(4.0)
        job = await store.get(job_id)

    assert job is not None and job.status == "succeeded" and job.finished_at == EPOCH + 3.0
    assert [at for at, _, _ in store.finishes] == [3.0, 4.0]


async def test_an_end_the_database_refuses_is_logged_once_and_the_job_fails_plainly(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(delay=2.0))
    async with node_jobs(tmp_path / "jobs.sqlite", engine, upstream, store_type=RefusingStore) as (
        jobs,
        store,
        _,
    ):
        assert isinstance(store, RefusingStore)
        store.finishes = []
        store.refusals = 1
        job_id = await _running(jobs, store, engine)
        with logged(job_id) as log:
            await trio.sleep(120.0)
            assert jobs.unwritten == 0
        job = await store.get(job_id)
        result = await store.result(job_id)

    # Not retried: the same end once, then at once a plain failure without the result.
    assert store.finishes == [(3.0, "succeeded", None), (3.0, "failed", "internal_error")]
    assert job is not None and job.status == "failed" and job.finished_at == EPOCH + 3.0
    assert job.error is not None and job.error.code == "internal_error"
    assert "could not store" in job.error.message
    assert result is None
    assert [(at, level) for at, level, _ in log.lines] == [(3.0, "ERROR")]
    message = log.lines[0][2]
    assert message.startswith(f"job {job_id}: cannot record its end: PostgreSQL: value too long")
    assert "not retried" in message


async def test_a_job_whose_every_end_is_refused_stays_running_and_is_not_retried(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(delay=2.0))
    async with node_jobs(tmp_path / "jobs.sqlite", engine, upstream, store_type=RefusingStore) as (
        jobs,
        store,
        _,
    ):
        assert isinstance(store, RefusingStore)
        store.finishes = []
        store.refusals = 100
        job_id = await _running(jobs, store, engine)
        with logged(job_id) as log:
            await trio.sleep(120.0)
            assert jobs.unwritten == 0
        job = await store.get(job_id)

    assert [at for at, _, _ in store.finishes] == [3.0, 3.0]
    assert job is not None and job.status == "running"
    assert [(at, level) for at, level, _ in log.lines] == [(3.0, "ERROR"), (3.0, "ERROR")]


async def test_a_backend_lost_while_the_database_is_lost_ends_as_the_core_says(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(
        Answer(delay=2.0, error=UpstreamError("connection reset", response_started=False))
    )
    async with node_jobs(tmp_path / "jobs.sqlite", engine, upstream) as (jobs, store, released):
        store.lose_once_running = True
        job_id = await _running(jobs, store, engine)
        # The connection breaks at 3 s; the core's verdict at 4 s: not ours.
        await trio.sleep(3.0)
        admission = engine.admission(job_id)
        assert admission.reports == [("upstream_lost", "connection reset")]
        engine.reject(job_id, "backend_failed", 502, "tts exited with status 1")
        await trio.sleep(6.0)
        store.lost = False
        store.lose_once_running = False
        await trio.sleep(2.0)
        job = await store.get(job_id)

    assert job is not None and job.status == "failed" and job.finished_at == EPOCH + 4.0
    assert job.error == JobError(
        code="backend_failed", message="tts exited with status 1", status=502
    )
    assert len(upstream.calls) == 1 and released.ids == []
    assert "runner failed" not in caplog.text


async def test_a_job_requeued_while_the_database_is_lost_goes_back_unrun_once_it_is_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(
        Answer(delay=2.0, error=UpstreamError("connection reset", response_started=False))
    )
    async with node_jobs(tmp_path / "jobs.sqlite", engine, upstream) as (jobs, store, released):
        store.lose_once_running = True
        job_id = await _running(jobs, store, engine)
        await trio.sleep(3.0)
        admission = engine.admission(job_id)
        assert admission.reports == [("upstream_lost", "connection reset")]
        # The core's verdict at 4 s: a self-caused OOM, back in the queue. Its
        # requeue cannot be written: it leaves this node's queue, unrun.
        engine.requeue(job_id)
        await trio.sleep(1.0)
        assert admission.cancelled and engine.snapshot().queue == ()
        assert released.ids == []
        await trio.sleep(5.0)
        store.lost = False
        store.lose_once_running = False
        await trio.sleep(2.0)
        job = await store.get(job_id)

    # Back in the shared queue with its one requeue spent, for any node to run.
    assert released.ids == [job_id]
    assert job is not None and (job.status, job.requeued, job.started_at) == (
        "queued",
        True,
        None,
    )
    assert len(upstream.calls) == 1
    assert "runner failed" not in caplog.text


async def test_a_refused_start_fails_the_job_and_its_refused_end_is_tried_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    class RefusesTheRequest(RefusingStore):
        async def request(self, job_id: str) -> StoredRequest | None:
            raise DatabaseError("PostgreSQL: permission denied for table job_requests")

    engine = FakeEngine()
    upstream = FakeUpstream()
    async with node_jobs(
        tmp_path / "jobs.sqlite", engine, upstream, store_type=RefusesTheRequest
    ) as (jobs, store, released):
        assert isinstance(store, RefusesTheRequest)
        store.finishes = []
        store.refusals = 100
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        job = await store.get(job_id)
        assert job is not None
        with logged(job_id) as log:
            jobs.enqueue(job, arrived_at_wall=job.created_at)
            engine.dispatch(job_id)
            await trio.sleep(60.0)

    # Not a lost database: not given back, not retried; the end it would
    # take instead (internal_error) is the same as the one refused.
    assert released.ids == [] and upstream.calls == []
    assert store.finishes == [(0.0, "failed", "internal_error")]
    assert [(at, level) for at, level, _ in log.lines] == [(0.0, "ERROR"), (0.0, "ERROR")]
    assert "runner failed" in log.lines[0][2]
    assert "cannot record its end: PostgreSQL: value too long" in log.lines[1][2]
