"""The job service: hand a request in now, fetch its result later.

Theory of operation. A job is a proxied request that does not hold its HTTP
connection. :meth:`Jobs.submit` writes it to the store (synced to disk) and
only then enqueues it into the engine, exactly like a synchronous request
(same queue, same priority order); the proxy answers 202. A runner task per
job holds its :class:`~yard.engine.Admission`: it waits for the dispatch,
marks the job running (durably, before a byte goes upstream), forwards the
request with the gateway's :func:`~yard.upstream.forward`, reads the whole
answer (up to ``max_result_bytes``), stores it and reports the outcome.

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

In a cluster (``shared=True``, the store a
:class:`~yard.cluster.jobs.PgJobStore`) a handed-in job is only stored, in
the shared queue, unclaimed: the node that claims it
(:mod:`yard.cluster.node`) calls :meth:`Jobs.enqueue`. Waiting for a job's end
then also re-reads the store (another node may run it). A write the shared
database does not take because it is lost or busy (:func:`yard.db.passing`)
is kept and made again every :attr:`Jobs.RETRY_S` until it is back, logged when
it begins, every :attr:`Jobs.LOG_EVERY_S` while it waits and when it is done:
a job's end; a requeue (the job leaves this node's queue unrun and goes back
to the shared queue, its one requeue spent); a job given back unrun. A write
the database refuses (any other error) is logged once and not made again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import trio

from yard.admission import AdmissionLike, Assignment, UpstreamLost, run_turn
from yard.config import JobsConfig
from yard.core.views import QueuedView
from yard.db import DatabaseError, passing
from yard.errors import Rejected
from yard.jobs.restore import restore
from yard.jobs.store import (
    JobError,
    JobRecord,
    JobStoreLike,
    Quota,
    QuotaExceeded,
    Status,
    StoredRequest,
    StoredResult,
)
from yard.jobs.upstream import ResultTooLarge, Upstream, fetch, pooled
from yard.jobs.views import job_json, rfc3339
from yard.upstream import ProxyRequest, UpstreamError, UpstreamPool

log = logging.getLogger("yard.jobs")

T = TypeVar("T")


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


class _Gone(Exception):
    """The job was cancelled while it was being dispatched."""


class _Unreachable(Exception):
    """The shared database was lost as the job was about to start."""

    def __init__(self, cause: DatabaseError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _RequeueUnwritten(Exception):
    """The core requeued the job, and the shared database was lost as that
    was to be written."""

    def __init__(self, cause: DatabaseError) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(slots=True)
class _Running:
    admission: AdmissionLike
    scope: trio.CancelScope
    cancelled: bool = False


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
    shared: the store is a cluster's shared queue: :meth:`submit` stores a
        job without enqueuing it (a node claims it), see the module notes.
    on_change: called when a job was handed in, dispatched or ended here
        (the cluster node looks for work then).
    release: gives a claimed job that has not started back to the shared
        queue (one found unstartable while the database was lost).
    """

    RETRY_S = 1.0
    """How often a write is made again while the shared database is lost or
    busy, and how often a wait for a job's end re-reads a shared store."""

    LOG_EVERY_S = 60.0
    """While such a write keeps failing, how often the log says so again."""

    def __init__(
        self,
        *,
        engine: EngineLike,
        store: JobStoreLike,
        pool: UpstreamPool | None = None,
        upstream: Upstream | None = None,
        config: JobsConfig | None = None,
        wall: Callable[[], float] = time.time,
        shared: bool = False,
        on_change: Callable[[], None] | None = None,
        release: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.shared = shared
        self._on_change = on_change or _nothing
        self.release = release
        self.unwritten = 0
        self.config = config or JobsConfig()
        self._upstream: Upstream = upstream or pooled(pool)
        self._wall = wall
        self._nursery: trio.Nursery | None = None
        self._run_started = False
        self._run_scope = trio.CancelScope()
        self._run_ended = trio.Event()
        self._running: dict[str, _Running] = {}
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
            raise Rejected(
                status=413,
                code="job_too_large",
                message=f"the request body is {len(request.body)} bytes; jobs store at most "
                f"{limit} bytes ([jobs] max_request_bytes)",
            )
        if self._nursery is None:
            raise Rejected(
                status=503,
                code="jobs_unavailable",
                message="the job service is not running (yard is starting or stopping); "
                "try again shortly",
                retry_after_s=1.0,
            )
        job_id = f"job_{uuid.uuid4().hex}"
        now_wall = self._wall()
        start_by = None
        if request.start_by is not None:
            start_by = now_wall + (request.start_by - self.engine.now())
            if rfc3339(start_by) is None:
                raise Rejected(
                    status=400,
                    code="invalid_deadline",
                    message="the deadline is out of range: it must fall between the years "
                    "0001 and 9999 (UTC)",
                )
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
        except QuotaExceeded as exc:
            raise self._over_quota(request.app, exc, now_wall) from None
        # On disk first, then into the queue: a crash in between leaves a
        # queued job that the next start enqueues. So does a stop that began
        # while it was being written: it is accepted, and waits for the restart.
        if self.shared:
            # The shared queue: whichever node can start it soonest claims it.
            self._counts["submitted"] += 1
            self._on_change()
            return self.describe(job)
        if self._nursery is not None:
            try:
                self.enqueue(job)
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

    def _over_quota(self, app: str, exc: QuotaExceeded, now_wall: float) -> Rejected:
        usage, quota = exc.usage, exc.quota
        free = (
            "Fetch the results you need and delete them (DELETE /v1/jobs/ID/result), cancel "
            "queued jobs you no longer need (DELETE /v1/jobs/ID), or wait until results "
            f"expire ([jobs] result_ttl_s = {self.config.result_ttl_s:g} s after each ends)"
        )
        retry = None
        if usage.oldest_finished_at is not None:
            retry = max(1.0, usage.oldest_finished_at + self.config.result_ttl_s - now_wall)
        if usage.jobs >= quota.max_jobs:
            return Rejected(
                status=429,
                code="too_many_jobs",
                message=f"app {app!r} keeps {usage.jobs} jobs (queued, running, or ended with "
                f"a result not yet expired), the most [jobs] max_jobs_per_app = "
                f"{quota.max_jobs} allows. {free}.",
                retry_after_s=retry,
            )
        return Rejected(
            status=507,
            code="job_storage_full",
            message=f"app {app!r} keeps {usage.bytes} bytes of job requests and results; "
            f"this request's {exc.size} bytes would go past [jobs] max_stored_bytes_per_app "
            f"= {quota.max_bytes}. {free}.",
            retry_after_s=retry,
        )

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
        running = _Running(admission=admission, scope=trio.CancelScope())
        self._running[job.id] = running
        nursery.start_soon(self._run_job, job, running)

    # -- the API's side ------------------------------------------------------

    async def get(self, job_id: str, *, app: str | None) -> JobRecord:
        """The job, if it exists and belongs to ``app`` (None: any app)."""
        if not job_id.isascii():  # yard's ids are; SQLite refuses lone surrogates
            raise JobNotFound(job_id)
        job = await self.store.get(job_id)
        if job is None or (app is not None and job.app != app):
            raise JobNotFound(job_id)
        return job

    async def wait_ended(self, job_id: str, *, app: str | None) -> JobRecord:
        """Return the job once it has ended (at once if it has). The caller
        bounds the wait (``trio.move_on_after``)."""
        while True:
            event = self._ended.setdefault(job_id, trio.Event())
            job = await self.get(job_id, app=app)
            if job.finished:
                self._ended.pop(job_id, None)
                return job
            if self.shared:
                # Another node may run it: its end is seen in the store only.
                with trio.move_on_after(self.RETRY_S):
                    await event.wait()
            else:
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
            running.cancelled = True
            running.admission.cancel()
            running.scope.cancel()
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

    async def _run_job(self, job: JobRecord, running: _Running) -> None:
        try:
            with running.scope:
                await self._drive(job, running)
        except Exception:
            # A bug or a broken disk must not take yard down with it; the job
            # ends as failed if the store still works, and frees its slot.
            log.exception("job %s: runner failed", job.id)
            running.admission.cancel()
            try:
                await self._end(
                    job.id,
                    "failed",
                    JobError(
                        code="internal_error", message="yard failed running this job", status=500
                    ),
                )
            except Exception:
                log.exception("job %s: cannot record that it failed", job.id)
        finally:
            self._running.pop(job.id, None)
            self._notify(job.id)

    async def _drive(self, job: JobRecord, running: _Running) -> None:
        admission = running.admission
        # The backend's answer (or why it is not kept), once it has answered.
        answer: list[StoredResult | ResultTooLarge] = []

        async def attempt(assignment: Assignment) -> None:
            # The request is read before the job is marked running: from
            # then on nothing stands between it and the backend, so a shared
            # database lost at that moment (a client may have just seen it
            # running) only delays the writing of its end, instead of
            # failing a job that never ran.
            try:
                stored = await self.store.request(job.id)
                started = stored is not None and await self.store.mark_running(
                    job.id, at=self._wall(), queued_s=admission.queued_s
                )
            except DatabaseError as exc:
                if not (self.shared and passing(exc)):
                    raise
                raise _Unreachable(exc) from None
            if stored is None or not started:
                # Ended (cancelled: an end drops the request) while it was
                # being dispatched, or held by another node.
                raise _Gone
            self._on_change()
            try:
                answer.append(
                    await fetch(
                        self._upstream,
                        job,
                        stored,
                        assignment.base_url,
                        limit=self.config.max_result_bytes,
                    )
                )
            except ResultTooLarge as exc:
                answer.append(exc)  # it answered: an ok turn, a failed job
            except UpstreamError as exc:
                # Nothing reached a client (a job reads the whole answer), so
                # the core may still find that the cause was ours and requeue
                # it (once, ever): mark the requeue spent before the verdict,
                # so that no crash in between can grant a second one.
                try:
                    await self.store.mark_requeue_spent(job.id)
                except DatabaseError as lost:
                    if not (self.shared and passing(lost)):
                        raise
                    # The verdict still comes, and whatever it leads to is
                    # written before the job can run again: an end when the
                    # database is back; a requeue as the job goes back to
                    # the shared queue, marked spent then (requeued()).
                    log.warning(
                        "job %s: cannot mark its one requeue spent now (%s); "
                        "the verdict on its lost backend is written when the database is back",
                        job.id,
                        lost,
                    )
                raise UpstreamLost(exc.detail) from None

        async def requeued() -> None:
            # Back in the queue: on disk too, so that a restart puts it back
            # at its place instead of ending it as interrupted.
            self._counts["requeues"] += 1
            try:
                await self.store.mark_requeued(job.id)
            except DatabaseError as exc:
                if not (self.shared and passing(exc)):
                    raise
                raise _RequeueUnwritten(exc) from None

        try:
            await run_turn(admission, attempt, on_requeued=requeued)
        except _Gone:
            admission.cancel()
            return
        except _Unreachable as exc:
            # The shared database is lost as it was about to start: it has not
            # run. It goes back to the shared queue once the database is back.
            admission.cancel()
            await self._give_back(job.id, exc.cause)
            return
        except _RequeueUnwritten as exc:
            # Requeued (yard's own out-of-memory), but the database, which
            # says it is running here, is lost. It must not run again before
            # that is written: it leaves this queue now, and once the
            # database is back it is marked requeued (its one requeue spent)
            # and given back to the shared queue at its old place.
            admission.cancel()
            await self._give_back(job.id, exc.cause, requeued=True)
            return
        except Rejected as exc:
            if exc.code != "shutting_down":
                error = JobError(code=exc.code, message=exc.message, status=exc.status)
                await self._end(job.id, "failed", error)
            # yard is stopping: the job stays as stored (queued, or running
            # and then interrupted) for the next start to decide.
            return
        result = answer[-1]
        if isinstance(result, ResultTooLarge):
            error = JobError(code="result_too_large", message=str(result), status=502)
            await self._end(job.id, "failed", error)
            return
        if 200 <= result.status < 400:
            await self._end(job.id, "succeeded", None, result)
            return
        error = JobError(
            code="upstream_status",
            message=f"the backend answered HTTP {result.status}; its answer is the job's result",
            status=result.status,
        )
        await self._end(job.id, "failed", error, result)

    async def _end(
        self,
        job_id: str,
        status: Status,
        error: JobError | None,
        result: StoredResult | None = None,
    ) -> None:
        # Shielded: a job that got its answer must record it even while yard
        # shuts down around it.
        at = self._wall()
        won: bool | None = None
        with trio.CancelScope(shield=True):
            try:
                won = await self.store.finish(job_id, status, at=at, error=error, result=result)
            except DatabaseError as exc:
                if not self.shared:
                    raise
                lost = exc
        ended: Status | None = status if won else None
        if won is None:
            # Not shielded: a stop of yard ends this wait.
            ended = await self._finish_later(job_id, status, at, error, result, lost)
        if ended is not None:
            self._counts["succeeded" if ended == "succeeded" else "failed"] += 1
        self._notify(job_id)
        self._on_change()

    async def _finish_later(
        self,
        job_id: str,
        status: Status,
        at: float,
        error: JobError | None,
        result: StoredResult | None,
        exc: DatabaseError,
    ) -> Status | None:
        """The shared database did not take the job's end (``exc``). Lost or
        busy: keep the end and write it once the database is back. Refused:
        end the job as failed (``internal_error``, without its result), so
        that it does not stay running. Returns the status written, or None
        if the job had ended already or no end could be written (it then
        stays running in the database until this node is reaped).

        Only yard's stop ends the wait; the job then stays running in the
        database, and the node that reaps this one ends it as interrupted."""
        self.unwritten += 1
        try:
            won = await self._when_back(
                job_id,
                "record its end",
                lambda: self.store.finish(job_id, status, at=at, error=error, result=result),
                exc,
            )
            if won is not None:
                return status if won else None
            if result is None and error is not None and error.code == "internal_error":
                return None  # already the plainest end there is
            plain = JobError(
                code="internal_error",
                message="yard could not store this job's end: the database refused it "
                "(yard's log says why)",
                status=500,
            )

            async def fail() -> bool:
                return await self.store.finish(job_id, "failed", at=at, error=plain)

            try:
                won = await fail()
            except DatabaseError as refused:
                won = await self._when_back(job_id, "record that it failed", fail, refused)
            return "failed" if won else None
        finally:
            self.unwritten -= 1

    async def _when_back(
        self,
        job_id: str,
        what: str,
        write: Callable[[], Awaitable[T]],
        exc: DatabaseError,
    ) -> T | None:
        """Make ``write`` (which just failed with ``exc``) again every
        :data:`RETRY_S` while the shared database is lost or busy, and return
        what it returns once it works. None once the database refuses it
        (an error that is not lost or busy), logged once at error level.

        Logged for people (``what`` completes "job ID: cannot ..."): when the
        wait begins, every :data:`LOG_EVERY_S` while it lasts, with how long
        it has waited, and when it is over."""
        began = trio.current_time()
        logged = began
        if not passing(exc):
            log.error(
                "job %s: cannot %s: %s (refused by the database: not retried)", job_id, what, exc
            )
            return None
        log.warning(
            "job %s: cannot %s now (%s); kept, and retried every %g s until the database is back",
            job_id,
            what,
            exc,
            self.RETRY_S,
        )
        while True:
            await trio.sleep(self.RETRY_S)
            try:
                value = await write()
            except DatabaseError as again:
                waited = trio.current_time() - began
                if not passing(again):
                    log.error(
                        "job %s: cannot %s after %.0f s: %s (refused by the database: not retried)",
                        job_id,
                        what,
                        waited,
                        again,
                    )
                    return None
                if trio.current_time() - logged >= self.LOG_EVERY_S:
                    logged = trio.current_time()
                    log.warning(
                        "job %s: still cannot %s after %.0f s (%s); retrying every %g s",
                        job_id,
                        what,
                        waited,
                        again,
                        self.RETRY_S,
                    )
                continue
            log.info(
                "job %s: could %s after %.0f s (the database is back)",
                job_id,
                what,
                trio.current_time() - began,
            )
            return value

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
                running.cancelled = True
                running.admission.cancel()
                running.scope.cancel()

    async def _give_back(self, job_id: str, exc: DatabaseError, *, requeued: bool = False) -> None:
        """Give a job claimed here back to the shared queue, at its old place,
        once the database is back (``exc``: why it could not be done now): one
        that has not run, or, with ``requeued``, one the core requeued after
        its backend was lost, marked so first (running -> queued, its one
        requeue spent). Nothing to do without a ``release``."""
        release = self.release
        if release is None:
            return

        async def back() -> bool:
            if requeued:
                await self.store.mark_requeued(job_id)
            return await release(job_id)

        what = "record its requeue and give it back" if requeued else "give it back"
        given = await self._when_back(job_id, f"{what} to the shared queue", back, exc)
        if given is False:
            log.info(
                "job %s: not given back: it ended or moved while the database was lost", job_id
            )

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
                if not self.shared:
                    raise
                log.warning("jobs: cannot expire old results now (%s)", exc)
            await trio.sleep(self.config.reap_interval_s)


def _nothing() -> None:
    return None
