"""The job service: hand a request in now, fetch its result later.

Theory of operation. A job is a proxied request that does not hold its HTTP
connection. :meth:`Jobs.submit` writes it to the store (synced to disk) and
only then enqueues it into the engine, exactly like a synchronous request
(same queue, same priority order); the proxy answers 202. A runner task per
job (:mod:`yard.jobs.runner`) holds its :class:`~yard.engine.Admission`: it
waits for the dispatch, marks the job running (durably, before a byte goes
upstream), forwards the request, reads the whole answer (up to
``max_result_bytes``), stores it and reports the outcome.

Rules it keeps:

- yard never retries. The only second run of a job is the one the core
  decides after a self-caused out-of-memory (the Admission is dispatched
  again; the job's ``requeued`` flag is stored so it never happens twice, even
  across restarts), or the one rerun after a restart for a job the client
  marked rerun-safe (see :mod:`yard.jobs.restore`).
- A job ends exactly once: the store's conditional update decides between a
  runner finishing and a client cancelling at the same moment.
- Times shown to people are wall-clock (RFC 3339); times given to the engine
  are on its clock, converted at the moment of the call.

Where a stored job goes is injected (:class:`JobQueue`): into this yard's
engine at once (:class:`LocalQueue`), or, on a node of a cluster
(:class:`yard.cluster.jobs.SharedQueue`), into the shared queue, unclaimed,
for the node that claims it (:mod:`yard.cluster.node`) to
:meth:`~Jobs.enqueue`; waiting for a job's end then also re-reads the store
(another node may run it). A write the database does not take because it is
lost or busy (a cluster's PostgreSQL) is kept and made again every
:attr:`Jobs.RETRY_S` until it is back (:mod:`yard.jobs.kept_writes`): a job's
end; a requeue (the job leaves this node's queue unrun and goes back to the
shared queue, its one requeue spent); a job given back unrun.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from yard.admission import AdmissionLike
from yard.config import JobsConfig
from yard.core.views import QueuedView
from yard.db import DatabaseError, passing
from yard.errors import Rejected
from yard.h1.upstream import ProxyRequest, UpstreamPool
from yard.jobs import refusals
from yard.jobs.kept_writes import KeptWrites
from yard.jobs.restore import restore
from yard.jobs.runner import Runner, Running
from yard.jobs.store import (
    JobError,
    JobRecord,
    JobStore,
    Quota,
    QuotaExceeded,
    Status,
    StoredRequest,
    StoredResult,
)
from yard.jobs.upstream import Upstream, pooled
from yard.jobs.views import job_json, rfc3339

log = logging.getLogger("yard.jobs")


class EngineLike(Protocol):
    """What the job service needs of :class:`yard.engine.Engine`."""

    def submit(
        self,
        *,
        backend: str,
        priority: float,
        app: str = "",
        request_id: str | None = None,
        start_by: float | None = None,
        allow_late: bool = False,
        arrived_at: float | None = None,
        requeued: bool = False,
    ) -> AdmissionLike: ...

    def now(self) -> float: ...

    def explain(self, request_id: str) -> QueuedView | None: ...


class JobQueue(Protocol):
    """Where the job service puts the jobs it stores (see the module notes)."""

    recheck_s: float
    """How often a wait for a job's end reads the store again (an end made
    elsewhere is seen there only); ``math.inf``: never."""

    def hand_in(self, jobs: Jobs, job: JobRecord) -> None:
        """``job`` was stored (handed in, or a batch line became it): start
        its turn. May raise :class:`~yard.errors.Rejected`."""

    def changed(self) -> None:
        """A job was dispatched or ended here: room may have appeared."""

    async def release(self, job_id: str) -> bool:
        """Give a job held here and not started back, for another to run
        (True if it was)."""


class LocalQueue:
    """This yard's own queue: a stored job enters the engine's queue at once,
    and ends only here."""

    recheck_s = math.inf

    def hand_in(self, jobs: Jobs, job: JobRecord) -> None:
        jobs.enqueue(job)

    def changed(self) -> None:
        pass

    async def release(self, job_id: str) -> bool:
        return False  # nobody else could run it


class JobNotFound(Exception):
    """No such job for this app (another app's job is not found either)."""


class JobFinished(Exception):
    """The job has already ended; it cannot be cancelled."""

    def __init__(self, job: JobRecord) -> None:
        super().__init__(f"job {job.id} has already ended ({job.status})")
        self.job = job


class JobNotFinished(Exception):
    """The job has not ended yet; it has no result to delete."""

    def __init__(self, job: JobRecord) -> None:
        super().__init__(f"job {job.id} is {job.status}; it has no result yet")
        self.job = job


@dataclass(frozen=True, slots=True, kw_only=True)
class JobsStatistics:
    """Counters since start (for /metrics and the dashboard)."""

    submitted: int
    restored: int
    succeeded: int
    failed: int
    cancelled: int
    interrupted: int
    reruns: int
    requeues: int
    expired: int
    active: int


class Jobs:
    """The job service. Build it, then start :meth:`run` with
    ``nursery.start`` after the engine is running; :meth:`submit` works once
    ``run`` has started (it restores the jobs of the last run first).

    engine: the engine (``yard.engine.Engine``) jobs are enqueued into.
    store: the job store (open).
    pool: the upstream connection pool (the gateway's).
    upstream: how requests reach backends (default: ``forward`` over ``pool``).
    wall: the wall clock (``time.time``; tests pass a virtual one).
    queue: where stored jobs go (default :class:`LocalQueue`).
    """

    RETRY_S = 1.0
    """How often a write is made again while the database is lost or busy."""

    LOG_EVERY_S = 60.0
    """While such a write keeps failing, how often the log says so again."""

    def __init__(
        self,
        *,
        engine: EngineLike,
        store: JobStore,
        pool: UpstreamPool | None = None,
        upstream: Upstream | None = None,
        config: JobsConfig | None = None,
        wall: Callable[[], float] = time.time,
        queue: JobQueue | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self._queue: JobQueue = queue or LocalQueue()
        self.config = config or JobsConfig()
        self._wall = wall
        self._kept = KeptWrites(
            store, release=self._queue.release, retry_s=self.RETRY_S, log_every_s=self.LOG_EVERY_S
        )
        self._runner = Runner(
            store=store,
            upstream=upstream or pooled(pool),
            kept=self._kept,
            wall=wall,
            max_result_bytes=self.config.max_result_bytes,
            on_dispatched=self._queue.changed,
            on_requeued=self._requeued,
            on_ended=self._ended_here,
        )
        self._nursery: trio.Nursery | None = None
        self._run_started = False
        self._run_scope = trio.CancelScope()
        self._run_ended = trio.Event()
        self._running: dict[str, Running] = {}
        self._ended: dict[str, trio.Event] = {}
        self._counts = dict.fromkeys(
            (
                "submitted",
                "restored",
                "succeeded",
                "failed",
                "cancelled",
                "interrupted",
                "reruns",
                "requeues",
                "expired",
            ),
            0,
        )

    # -- lifecycle -----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Restore the jobs of the last run, then serve until cancelled (the
        runners and the reaper live here). Ready (``task_status.started()``)
        once every restored job is back in the engine's queue."""
        self._run_started = True
        try:
            with self._run_scope:
                await self._serve(task_status)
        finally:
            self._run_ended.set()

    async def stop(self) -> None:
        """Stop :meth:`run` (if it started) and return once it has ended: every
        runner has recorded what it could, so the store may close. Jobs left
        queued or running stay so on disk, for the next start to restore."""
        if self._run_started:
            self._run_scope.cancel()
            await self._run_ended.wait()

    async def _serve(self, task_status: trio.TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                summary = await restore(self)
                self._counts["restored"] += summary.queued + summary.rerun
                self._counts["reruns"] += summary.rerun
                self._counts["interrupted"] += summary.interrupted
                if summary.total:
                    log.info("jobs restored: %s", summary.describe())
                nursery.start_soon(self._reap_forever)
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def statistics(self) -> JobsStatistics:
        return JobsStatistics(active=len(self._running), **self._counts)

    @property
    def unwritten(self) -> int:
        """How many jobs' ends are kept for the shared database now, waiting
        for it to be back."""
        return self._kept.unwritten

    def now(self) -> float:
        """The wall-clock time, as the service sees it."""
        return self._wall()

    # -- the proxy's side ----------------------------------------------------

    async def submit(self, request: ProxyRequest, *, rerun_safe: bool) -> dict[str, object]:
        """Store ``request`` as a job (synced to disk), enqueue it, start its
        runner, and return the job's JSON.

        Raises :class:`~yard.engine.Rejected` (413 ``job_too_large``; 503
        ``jobs_unavailable`` before :meth:`run` started; or whatever the
        engine refuses at once), in which case nothing was stored.
        """
        limit = self.config.max_request_bytes
        if limit is not None and len(request.body) > limit:
            raise refusals.too_large(len(request.body), limit)
        if self._nursery is None:
            raise refusals.not_running()
        job_id = f"job_{uuid.uuid4().hex}"
        now_wall = self._wall()
        start_by = None
        if request.start_by is not None:
            start_by = now_wall + (request.start_by - self.engine.now())
            if rfc3339(start_by) is None:
                raise refusals.deadline_out_of_range()
        not_before = None
        if request.not_before is not None:
            # The window is kept on the wall clock, like the deadline: it survives restarts.
            not_before = now_wall + (request.not_before - self.engine.now())
        quota = Quota(
            max_jobs=self.config.max_jobs_per_app,
            max_bytes=self.config.max_stored_bytes_per_app,
        )
        try:
            job = await self._insert(
                job_id, request, start_by, rerun_safe, now_wall, quota, not_before
            )
        except DatabaseError as exc:
            if not passing(exc):
                raise
            raise refusals.database_unavailable(exc) from None
        except QuotaExceeded as exc:
            raise refusals.over_quota(
                request.app, exc, now_wall=now_wall, result_ttl_s=self.config.result_ttl_s
            ) from None
        # On disk first, then into the queue: a crash in between leaves a
        # queued job that the next start enqueues. So does a stop that began
        # while it was being written: it is accepted, and waits for the restart.
        if self._nursery is not None:
            try:
                self.hand_in(job)
            except Rejected:
                await self.store.delete(job_id)
                raise
        self._counts["submitted"] += 1
        return self.describe(job)

    async def _insert(
        self,
        job_id: str,
        request: ProxyRequest,
        start_by: float | None,
        rerun_safe: bool,
        now_wall: float,
        quota: Quota,
        not_before: float | None = None,
    ) -> JobRecord:
        return await self.store.insert(
            job_id=job_id,
            app=request.app,
            model=request.model or request.backend,
            backend=request.backend,
            priority=request.priority,
            start_by=start_by,
            not_before=not_before,
            allow_late=request.allow_late,
            rerun_safe=rerun_safe,
            created_at=now_wall,
            request=StoredRequest(
                method=request.method,
                path=request.path,
                query=request.query.decode("latin-1"),
                headers=tuple(request.headers),
                body=request.body,
            ),
            quota=quota,
        )

    def hand_in(self, job: JobRecord) -> None:
        """Start the turn of a job just stored (handed in, or a batch line
        that became it), through the queue (see the module notes). May raise
        :class:`~yard.errors.Rejected` (the job stays stored)."""
        self._queue.hand_in(self, job)

    def enqueue(self, job: JobRecord, *, arrived_at_wall: float | None = None) -> None:
        """Put a stored queued job into the engine and start its runner.

        arrived_at_wall: its original arrival (epoch); the engine gets it on
        its own clock so that aging keeps counting across a restart.
        """
        nursery = self._nursery
        if nursery is None:
            raise RuntimeError("Jobs.run() has not started")
        now_engine = self.engine.now()
        now_wall = self._wall()
        # A time window (X-Yard-Not-Before), kept on the wall clock: held until it opens.
        window: dict[str, Any] = {}
        if job.not_before is not None:
            window["not_before"] = now_engine + (job.not_before - now_wall)
            window["window_label"] = f"{rfc3339(job.not_before)} (X-Yard-Not-Before)"
        admission = self.engine.submit(
            backend=job.backend,
            priority=job.priority,
            app=job.app,
            request_id=job.id,
            start_by=None if job.start_by is None else now_engine + (job.start_by - now_wall),
            allow_late=job.allow_late,
            arrived_at=(
                None if arrived_at_wall is None else now_engine - (now_wall - arrived_at_wall)
            ),
            requeued=job.requeued,
            **window,
        )
        running = Running(admission=admission, scope=trio.CancelScope(), job=job)
        self._running[job.id] = running
        nursery.start_soon(self._run_job, job, running)

    # -- the API's side ------------------------------------------------------

    async def get(self, job_id: str, *, app: str | None) -> JobRecord:
        """The job, if it exists and belongs to ``app`` (None: any app)."""
        if not job_id.isascii():  # yard's ids are; SQLite refuses lone surrogates
            raise JobNotFound(job_id)
        try:
            job = await self.store.get(job_id)
        except DatabaseError as exc:
            job = self._held(job_id, exc)
        if job is None or (app is not None and job.app != app):
            raise JobNotFound(job_id)
        return job

    def _held(self, job_id: str, exc: DatabaseError) -> JobRecord:
        """What this yard knows of a job it holds while the database does not
        answer (``exc``, lost or busy); else :class:`~yard.errors.Rejected`
        503 (a JSON answer with ``Retry-After``)."""
        running = self._running.get(job_id)
        if running is None or not passing(exc):
            raise refusals.database_unavailable(exc) from None
        status: Status = "queued" if running.admission.state == "queued" else "running"
        note = f"the database cannot be reached now ({exc}): this is what this yard knows"
        return dataclasses.replace(running.job, status=status, notes=(*running.job.notes, note))

    async def wait_ended(self, job_id: str, *, app: str | None) -> JobRecord:
        """Return the job once it has ended (at once if it has). The caller
        bounds the wait (``trio.move_on_after``)."""
        while True:
            event = self._ended.setdefault(job_id, trio.Event())
            job = await self.get(job_id, app=app)
            if job.finished:
                self._ended.pop(job_id, None)
                return job
            # Another node may run it: its end is seen in the store only.
            with trio.move_on_after(self._queue.recheck_s):
                await event.wait()

    async def cancel(self, job_id: str, *, app: str | None) -> JobRecord:
        """Cancel a queued or running job: it leaves the queue, or its upstream
        request is cancelled. Raises :class:`JobNotFound`, or
        :class:`JobFinished` if it had already ended."""
        await self.get(job_id, app=app)  # another app's job does not exist
        won = await self.store.finish(
            job_id,
            "cancelled",
            at=self._wall(),
            error=JobError(code="cancelled", message="the job was cancelled", status=499),
        )
        if not won:
            raise JobFinished(await self.get(job_id, app=app))
        self._counts["cancelled"] += 1
        running = self._running.get(job_id)
        if running is not None:
            running.cancel()
        self._notify(job_id)
        return await self.get(job_id, app=app)

    async def delete_result(self, job_id: str, *, app: str | None) -> JobRecord:
        """Delete an ended job's result now (it becomes ``expired``), which
        frees its place in the app's quota. Raises :class:`JobNotFound`, or
        :class:`JobNotFinished` if it has not ended."""
        job = await self.get(job_id, app=app)
        if not await self.store.forget_result(job_id):
            raise JobNotFinished(job)
        return await self.get(job_id, app=app)

    async def list_jobs(
        self,
        *,
        app: str | None,
        statuses: Sequence[Status] = (),
        limit: int = 20,
        after: str | None = None,
    ) -> tuple[list[JobRecord], bool]:
        """The app's jobs, newest first, and whether there are more.

        after: the id of the last job of the previous page (a cursor).
        Raises :class:`JobNotFound` for an unknown cursor.
        """
        before_seq = None
        if after is not None:
            before_seq = (await self.get(after, app=app)).seq
        jobs = await self.store.list_jobs(
            app=app, statuses=statuses, limit=limit + 1, before_seq=before_seq
        )
        return jobs[:limit], len(jobs) > limit

    async def result(
        self, job_id: str, *, app: str | None
    ) -> tuple[JobRecord, StoredResult | None]:
        job = await self.get(job_id, app=app)
        return job, await self.store.result(job_id)

    def describe(self, job: JobRecord) -> dict[str, object]:
        """The job's JSON (what ``GET /v1/jobs/ID`` answers)."""
        status = job.status
        running = self._running.get(job.id)
        if status == "running" and running is not None and running.admission.state == "queued":
            status = "queued"  # requeued after a self-caused OOM, waiting for its turn again
        view = self.engine.explain(job.id) if status == "queued" else None
        return job_json(
            job,
            status=status,
            view=view,
            now_wall=self._wall(),
            now_engine=self.engine.now(),
            result_ttl_s=self.config.result_ttl_s,
        )

    # -- runners -------------------------------------------------------------

    async def _run_job(self, job: JobRecord, running: Running) -> None:
        try:
            await self._runner.run(job, running)
        finally:
            self._running.pop(job.id, None)
            self._notify(job.id)

    def _requeued(self) -> None:
        self._counts["requeues"] += 1

    def _ended_here(self, job_id: str, status: Status | None) -> None:
        if status is not None:
            self._counts["succeeded" if status == "succeeded" else "failed"] += 1
        self._notify(job_id)
        self._queue.changed()

    async def ended_elsewhere(self, job_ids: AbstractSet[str] | None) -> None:
        """Jobs ended in the shared store, perhaps by another node (a cluster
        announces every end; None: any may have). Waiters for them look again
        at once, and a job running here that was cancelled elsewhere has its
        upstream request cancelled, as if it had been cancelled here."""
        ids = set(self._ended) | set(self._running) if job_ids is None else set(job_ids)
        for job_id in ids:
            self._notify(job_id)
            running = self._running.get(job_id)
            if running is None or running.cancelled:
                continue
            job = await self.store.get(job_id)
            if job is not None and job.status == "cancelled" and not running.cancelled:
                log.info("job %s: cancelled on another node; its request here is cancelled", job_id)
                running.cancel()

    def _notify(self, job_id: str) -> None:
        event = self._ended.pop(job_id, None)
        if event is not None:
            event.set()

    # -- expiry --------------------------------------------------------------

    async def reap(self) -> int:
        """Expire results older than ``result_ttl_s`` and forget expired jobs
        older than ``record_ttl_s`` after that. Returns how many expired."""
        now = self._wall()
        expired = await self.store.expire(finished_before=now - self.config.result_ttl_s)
        await self.store.purge(
            finished_before=now - self.config.result_ttl_s - self.config.record_ttl_s
        )
        self._counts["expired"] += len(expired)
        return len(expired)

    async def _reap_forever(self) -> None:
        while True:
            try:
                await self.reap()
            except DatabaseError as exc:
                log.warning("jobs: cannot expire old results now (%s)", exc)
            await trio.sleep(self.config.reap_interval_s)
