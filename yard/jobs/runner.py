"""A job's runner: the task that takes one job through its turn.

The job service (:class:`yard.jobs.service.Jobs`) starts one runner task per
job it enqueues. The runner holds the job's
:class:`~yard.admission.AdmissionLike` and runs its turn with
:func:`yard.admission.run_turn`: once dispatched, it marks the job running
(durably, before a byte goes upstream), forwards the stored request with
:func:`yard.jobs.upstream.fetch`, reads the whole answer (up to
``max_result_bytes``), stores it and reports the outcome.

Rules it keeps:

- yard never retries. The only second run here is the one the core decides
  after a self-caused out-of-memory; the job's one requeue is marked spent
  before the core's verdict, so that no crash in between can grant a second.
- A job ends exactly once: the store's conditional update decides between a
  runner finishing and a client cancelling at the same moment.
- A job that got its answer records it even while yard shuts down around it;
  a job yard's stop refuses stays as stored, for the next start to decide.
- In a cluster, a write the shared database does not take is kept
  (:mod:`yard.jobs.kept_writes`); a job that cannot start because the
  database is lost goes back to the shared queue unrun.
- A failing runner (a bug, a broken disk) ends its job as failed, if the
  store still works, and never takes yard down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from yard.admission import AdmissionLike, Assignment, UpstreamLost, run_turn
from yard.db import DatabaseError, passing
from yard.errors import Rejected
from yard.h1.upstream import UpstreamError
from yard.jobs.kept_writes import KeptWrites
from yard.jobs.records import JobError, JobRecord, Status, StoredResult
from yard.jobs.store import JobStore
from yard.jobs.upstream import ResultTooLarge, Upstream, fetch

__all__ = ["Runner", "Running"]

log = logging.getLogger("yard.jobs")


@dataclass(slots=True)
class Running:
    """A job whose runner is live: its admission, the scope its upstream
    request runs in, whether it was cancelled, and the job as enqueued."""

    admission: AdmissionLike
    scope: trio.CancelScope
    job: JobRecord
    cancelled: bool = False

    def cancel(self) -> None:
        """The job was cancelled: it leaves the queue, or its upstream request
        is cancelled."""
        self.cancelled = True
        self.admission.cancel()
        self.scope.cancel()


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Runner:
    """Runs the turns of one job service's jobs: :meth:`run` is one job's
    runner task.

    store: the job store. upstream: how requests reach backends.
    kept: where writes the shared database did not take are kept.
    wall: the wall clock.
    max_result_bytes: the largest answer a job stores (``[jobs]``).
    on_dispatched: called when a job was dispatched and marked running.
    on_requeued: called when the core requeued a job after its backend was
        lost (a self-caused out-of-memory).
    on_ended: called when the runner is done ending a job, with the status it
        wrote (None: the job had ended already, or no end could be written).
    """

    store: JobStore
    upstream: Upstream
    kept: KeptWrites
    wall: Callable[[], float]
    max_result_bytes: int
    on_dispatched: Callable[[], None]
    on_requeued: Callable[[], None]
    on_ended: Callable[[str, Status | None], None]

    async def run(self, job: JobRecord, running: Running) -> None:
        """Take ``job`` through its turn and end it (see the module rules).
        An error is logged and ends the job as failed; it is not raised."""
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

    async def _drive(self, job: JobRecord, running: Running) -> None:
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
                    job.id, at=self.wall(), queued_s=admission.queued_s
                )
            except DatabaseError as exc:
                if not passing(exc):
                    raise
                raise _Unreachable(exc) from None
            if stored is None or not started:
                # Ended (cancelled: an end drops the request) while it was
                # being dispatched, or held by another node.
                raise _Gone
            self.on_dispatched()
            try:
                answer.append(
                    await fetch(
                        self.upstream,
                        job,
                        stored,
                        assignment.base_url,
                        limit=self.max_result_bytes,
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
                    if not passing(lost):
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
            self.on_requeued()
            try:
                await self.store.mark_requeued(job.id)
            except DatabaseError as exc:
                if not passing(exc):
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
            await self.kept.give_back(job.id, exc.cause)
            return
        except _RequeueUnwritten as exc:
            # Requeued (yard's own out-of-memory), but the database, which
            # says it is running here, is lost. It must not run again before
            # that is written: it leaves this queue now, and once the
            # database is back it is marked requeued (its one requeue spent)
            # and given back to the shared queue at its old place.
            admission.cancel()
            await self.kept.give_back(job.id, exc.cause, requeued=True)
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
        at = self.wall()
        won: bool | None = None
        with trio.CancelScope(shield=True):
            try:
                won = await self.store.end_run(job_id, status, at=at, error=error, result=result)
            except DatabaseError as exc:
                lost = exc  # kept, or (refused) ended plainly
        ended: Status | None = status if won else None
        if won is None:
            # Not shielded: a stop of yard ends this wait.
            ended = await self.kept.finish(
                job_id, status, at=at, error=error, result=result, exc=lost
            )
        self.on_ended(job_id, ended)
