"""The batch service: OpenAI's Batch API on top of durable jobs.

Theory of operation. ``POST /v1/batches`` records the batch as
``validating`` (synced to disk) and answers. A driver task per batch then:

1. validates the input file line by line (:mod:`yard.batches.validate`); any
   bad line fails the batch with ``errors.data``; else its lines are written,
   grouped by model, and it is ``in_progress`` (one transaction);
2. feeds the lines to the job service in that order, at most ``[jobs]
   batch_queued_lines`` of them queued or running at once. A line becomes a
   job in the transaction that records its job id (so no crash makes it
   twice), then enters the engine's queue like any ``Prefer: respond-async``
   request: same queue, same store, same never-retry rule; a line running
   when yard dies ends ``interrupted`` unless the batch was created with
   ``Prefer: rerun-safe``;
3. records each line's outcome (the line of the output or error file) as its
   job ends, and frees the job's result;
4. once every line has an outcome, writes the output and error files and
   ends the batch ``completed``, ``expired`` or ``cancelled``.

The completion window is a finish-by. A line's job gets a start-by of the
window's end minus the measured service time of its backend (the longest of
the latest runs there, else ``[scheduler] default_service_s``), without
allow-late: the core refuses it at once if it cannot start in time, or ends it
when its start-by passes while it waits, and that line is ``batch_expired``;
lines still on disk then expire without becoming jobs; the batch ends
``expired`` with every finished line in its output file.

Priority: a line runs ``[jobs] batch_priority_drop`` below its app's default
priority, so the app's interactive requests go first, until the lines left
for its backend need the rest of the window (their count over the backend's
slots, times the mean service time): then at the default. The core's
deadline urgency takes over near each line's start-by.

Grouping by model: lines are fed in model order, one model's lines after
another's, so the queue holds one model's lines at a time (give or take the
tail of the previous one). The core's swap batching serves a loaded
backend's queued requests before it swaps to another (within its
``batch_bound``), so each model loads once when the others need not evict it.

A restart (even after SIGKILL) picks every batch that has not ended up where
it was: validation again if it had not finished, else the job service has
already put the lines' jobs back, and the driver watches them and feeds the
rest.

In a cluster (the job service on a :class:`~yard.cluster.jobs.PgJobStore`),
files, batches and lines live in the shared database
(:class:`~yard.cluster.batches.PgBatchStore`), so any node reads and cancels
any batch. A line becomes a job of the shared queue, unclaimed, and whichever
node can serve it soonest claims it (this node does not enqueue it itself).
One node drives a batch: the one it was created on, until it stops or is
declared gone in the node registry; every ``[cluster] heartbeat_s`` each node
adopts the batches nobody alive drives, drops the drivers of batches another
node has taken, and sees cancels made on other nodes. A second driver for a
while is harmless: each line becomes a job once and ends once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import trio

from yard.batches.records import (
    ENDPOINTS,
    BatchError,
    BatchRecord,
    BatchStatus,
    FileRecord,
    LineRecord,
)
from yard.batches.store import BatchStore, BatchStoreLike, FileLimit
from yard.batches.validate import BadRequest, Checked, check_input, check_metadata
from yard.batches.views import CANCELLED_MESSAGE, EXPIRED_MESSAGE, error_line, job_line
from yard.cluster.batches import PgBatchStore
from yard.cluster.jobs import PgJobStore
from yard.config import AppConfig, Config
from yard.db import DatabaseError
from yard.errors import Rejected
from yard.http.intake import local_app
from yard.jobs.service import JobFinished, JobNotFound, Jobs
from yard.jobs.store import JobStore

log = logging.getLogger("yard.batches")

_WINDOW = re.compile(r"([1-9][0-9]{0,5})h")
_SERVICE_REFRESH_S = 5.0
_INLINE_CHECK_BYTES = 256 * 2**10


@dataclass(slots=True)
class _Driver:
    """A running batch: whether it is being cancelled, the service time
    figures it uses (backend -> (mean, high, measured?, when)), its lines
    queued or running per backend, and an event set when one of them ends."""

    cancelling: bool = False
    service: dict[str, tuple[float, float, bool, float]] = field(default_factory=dict)
    inflight: Counter[str] = field(default_factory=Counter)
    ended: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    def line_ended(self, backend: str) -> None:
        self.inflight[backend] -= 1
        self.ended.set()
        self.ended = trio.Event()


class Batches:
    """The batch service. Build it, then start :meth:`run` with
    ``nursery.start`` after the job service is running.

    jobs: the job service (running); lines become its jobs.
    config: the whole configuration (``[jobs]`` batch keys, apps, backends).
    wall: the wall clock (``time.time``).
    """

    def __init__(
        self, *, jobs: Jobs, config: Config, wall: Callable[[], float] = time.time
    ) -> None:
        self.jobs = jobs
        # Lines become jobs in the same transaction as their line's state: the
        # batch tables live beside the jobs, in SQLite or in the cluster's database.
        self.store: BatchStoreLike
        if isinstance(jobs.store, JobStore):
            self.store = BatchStore(jobs.store)
        elif isinstance(jobs.store, PgJobStore):
            self.store = PgBatchStore(jobs.store, aging_rate=config.scheduler.aging_rate)
        else:
            raise TypeError("the Batch API needs the job service on a SQLite or PostgreSQL store")
        self._shared = isinstance(self.store, PgBatchStore)
        self.config = config
        self._wall = wall
        self._nursery: trio.Nursery | None = None
        self._drivers: dict[str, _Driver] = {}
        self._run_scope = trio.CancelScope()
        self._run_ended = trio.Event()
        self._run_started = False

    # -- lifecycle -----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Pick up every batch that has not ended, then serve until cancelled."""
        self._run_started = True
        try:
            with self._run_scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    try:
                        await self._adopt()
                        if isinstance(self.store, PgBatchStore):
                            nursery.start_soon(self._look_around, self.store)
                        task_status.started()
                        await trio.sleep_forever()
                    finally:
                        self._nursery = None
        finally:
            self._run_ended.set()

    async def _adopt(self) -> None:
        """Drive every batch that has not ended and that this node may drive."""
        for batch in await self.store.unended():
            if batch.id in self._drivers:
                continue
            if isinstance(self.store, PgBatchStore):
                if not await self.store.adopt(batch.id):
                    continue
                log.info("batch %s: driven by node %s", batch.id, self.store.node)
            self._drive(batch)

    async def _look_around(self, store: PgBatchStore) -> None:
        """A cluster node, every ``[cluster] heartbeat_s``: adopt the batches
        whose driver is gone, stop driving those another node took over, and
        hear of cancels made on another node."""
        cluster = self.config.cluster
        every = cluster.heartbeat_s if cluster is not None else 2.0
        while True:
            await trio.sleep(every)
            try:
                for batch_id, driver in list(self._drivers.items()):
                    batch = await store.batch(batch_id)
                    if batch is None or batch.ended:
                        continue
                    if not await store.drives(batch_id):
                        log.info("batch %s: driven by another node now", batch_id)
                        driver.scope.cancel()
                    elif batch.status == "cancelling" and not driver.cancelling:
                        driver.cancelling = True
                await self._adopt()
            except DatabaseError as exc:
                log.warning("batches: the shared database is not answering (%s)", exc)

    async def stop(self) -> None:
        """Stop :meth:`run` and return once every driver has stopped (what they
        did is on disk; the next start goes on from there). A cluster node
        gives its batches up, for another node to drive at once."""
        if self._run_started:
            self._run_scope.cancel()
            await self._run_ended.wait()
            if isinstance(self.store, PgBatchStore):
                try:
                    await self.store.release()
                except DatabaseError as exc:
                    log.warning("batches: could not give the batches up as it stopped (%s)", exc)

    def _drive(self, batch: BatchRecord) -> None:
        if self._nursery is None or batch.id in self._drivers:
            return
        driver = _Driver(cancelling=batch.status == "cancelling")
        self._drivers[batch.id] = driver
        self._nursery.start_soon(self._run_batch, batch.id, driver)

    # -- files ---------------------------------------------------------------

    async def upload(self, *, app: str, purpose: str, filename: str, content: bytes) -> FileRecord:
        """Store an uploaded file. Raises :class:`BadRequest`."""
        jobs_config = self.config.jobs
        if purpose != "batch":
            raise BadRequest(
                400,
                "invalid_purpose",
                f"purpose {purpose!r} is not supported here; yard keeps files for the Batch "
                "API only: purpose=batch",
                "purpose",
            )
        if len(content) > jobs_config.batch_max_file_bytes:
            raise BadRequest(
                413,
                "file_too_large",
                f"the file is {len(content)} bytes; yard takes files up to "
                f"{jobs_config.batch_max_file_bytes} bytes ([jobs] batch_max_file_bytes): "
                "split the batch",
                "file",
            )
        try:
            return await self.store.add_file(
                file_id=f"file-{uuid.uuid4().hex}",
                app=app,
                purpose=purpose,
                filename=filename,
                content=content,
                created_at=self._wall(),
                max_files=jobs_config.batch_max_files_per_app,
            )
        except FileLimit as exc:
            raise BadRequest(
                429,
                "too_many_files",
                f"app {app!r} keeps {exc.count} files, the most [jobs] "
                "batch_max_files_per_app allows; delete files you no longer need "
                "(DELETE /v1/files/ID)",
            ) from None

    async def file(self, file_id: str, *, app: str | None) -> FileRecord:
        """The file, if it belongs to ``app`` (None: any). Raises :class:`BadRequest` 404."""
        record = await self.store.file(file_id) if file_id.isascii() else None
        if record is None or (app is not None and record.app != app):
            raise BadRequest(404, "file_not_found", f"no file {file_id!r} for this API key")
        return record

    # -- batches -------------------------------------------------------------

    async def create(
        self,
        *,
        app: AppConfig,
        input_file_id: object,
        endpoint: object,
        completion_window: object,
        metadata: object,
        rerun_safe: bool,
    ) -> BatchRecord:
        """Record a new batch (``validating``) and start its driver. Raises
        :class:`BadRequest` for a bad field (nothing stored then)."""
        if self._nursery is None:
            raise BadRequest(
                503, "batches_unavailable", "yard is starting or stopping; try again shortly"
            )
        if not isinstance(input_file_id, str) or not input_file_id:
            raise BadRequest(
                400, "invalid_request", "input_file_id must be a file id", "input_file_id"
            )
        if endpoint not in ENDPOINTS:
            raise BadRequest(
                400,
                "invalid_request",
                f"endpoint must be one of {', '.join(ENDPOINTS)}",
                "endpoint",
            )
        assert isinstance(endpoint, str)
        window_s = self.window_seconds(completion_window)
        assert isinstance(completion_window, str)
        checked = check_metadata(metadata)
        source = await self.file(input_file_id, app=app.name)
        if source.purpose != "batch":
            raise BadRequest(
                400,
                "invalid_request",
                f"file {source.id} has purpose {source.purpose!r}; a batch reads a file "
                "uploaded with purpose=batch",
                "input_file_id",
            )
        now = self._wall()
        batch = await self.store.add_batch(
            batch_id=f"batch_{uuid.uuid4().hex}",
            app=app.name,
            endpoint=endpoint,
            input_file_id=source.id,
            completion_window=completion_window,
            metadata=checked,
            priority=app.default_priority,
            rerun_safe=rerun_safe,
            created_at=now,
            expires_at=now + window_s,
        )
        self._drive(batch)
        return batch

    def window_seconds(self, window: object) -> float:
        """Seconds of a ``completion_window``: ``"Nh"``, 1 hour up to
        ``[jobs] batch_max_window_s``. Raises :class:`BadRequest`."""
        most = self.config.jobs.batch_max_window_s
        match = _WINDOW.fullmatch(window) if isinstance(window, str) else None
        seconds = int(match.group(1)) * 3600.0 if match else math.inf
        if seconds > most:
            raise BadRequest(
                400,
                "invalid_completion_window",
                f"completion_window must be a whole number of hours from 1h to "
                f'{int(most // 3600)}h ([jobs] batch_max_window_s), such as "24h"',
                "completion_window",
            )
        return seconds

    async def get(self, batch_id: str, *, app: str | None) -> BatchRecord:
        """The batch, if it belongs to ``app`` (None: any). Raises :class:`BadRequest` 404."""
        batch = await self.store.batch(batch_id) if batch_id.isascii() else None
        if batch is None or (app is not None and batch.app != app):
            raise BadRequest(404, "batch_not_found", f"no batch {batch_id!r} for this API key")
        return batch

    async def counts(self, batch: BatchRecord) -> tuple[int, int] | None:
        """(completed, failed) so far for a batch that has not ended, else None."""
        if batch.ended:
            return None
        completed, failed, _ = await self.store.counts(batch.id)
        return completed, failed

    async def cancel(self, batch_id: str, *, app: str | None) -> BatchRecord:
        """Cancel a batch: ``cancelling`` at once; its lines not yet started
        end ``batch_cancelled``, the running ones finish; then ``cancelled``
        with the finished lines in its output file. Raises :class:`BadRequest`
        (404; 409 once it has ended)."""
        batch = await self.get(batch_id, app=app)
        if batch.status != "cancelling" and not await self.store.mark_cancelling(
            batch.id, at=self._wall()
        ):
            batch = await self.get(batch_id, app=app)
            if batch.status != "cancelling":
                raise BadRequest(
                    409,
                    "batch_not_cancellable",
                    f"batch {batch.id} is {batch.status}; only a batch that is validating "
                    "or in progress can be cancelled",
                )
        driver = self._drivers.get(batch.id)
        if driver is not None:
            driver.cancelling = True
        for line in await self.store.lines(batch.id):
            if line.job_id is not None and line.outcome is None:
                await self._cancel_if_queued(line.job_id)
        return await self.get(batch_id, app=app)

    async def _cancel_if_queued(self, job_id: str) -> None:
        job = await self.jobs.store.get(job_id)
        if job is not None and job.status == "queued":
            with contextlib.suppress(JobFinished, JobNotFound):
                await self.jobs.cancel(job_id, app=None)

    # -- drivers -------------------------------------------------------------

    async def _run_batch(self, batch_id: str, driver: _Driver) -> None:
        try:
            with driver.scope:
                await self._run_lines(batch_id, driver)
        except Exception:
            # A bug or a broken disk: the batch stays as stored, and the next
            # start picks it up again.
            log.exception("batch %s: driver failed", batch_id)
        finally:
            self._drivers.pop(batch_id, None)

    async def _run_lines(self, batch_id: str, driver: _Driver) -> None:
        batch = await self.store.batch(batch_id)
        if batch is None or batch.ended:
            return
        if batch.status == "validating" and not await self._validate(batch):
            return
        lines = await self.store.lines(batch_id)
        left = Counter(line.backend for line in lines if line.outcome is None)
        room = trio.Semaphore(self.config.jobs.batch_queued_lines)
        async with trio.open_nursery() as nursery:
            for line in lines:
                if line.outcome is not None:
                    continue
                await room.acquire()
                if line.job_id is None:
                    await self._first_measurement(line.backend, driver)
                    submitted = await self._submit(batch, line, driver, left[line.backend])
                    left[line.backend] -= 1
                    if submitted is None:
                        room.release()
                        continue
                    line = submitted
                else:
                    left[line.backend] -= 1
                driver.inflight[line.backend] += 1
                nursery.start_soon(self._watch, line, driver, room)
        await self._finish(batch_id, driver)

    async def _first_measurement(self, backend: str, driver: _Driver) -> None:
        """Until a run on ``backend`` has been measured, hand in no more of
        this batch's lines there than it has slots: a line's start-by is fixed
        when it is handed in, and the default service time may be far off."""
        config = self.config.backends.get(backend)
        slots = config.slots if config is not None else 1
        while driver.inflight[backend] >= slots:
            # Taken before the read below: a line that ends meanwhile sets it.
            ended = driver.ended
            _, _, measured = await self._service(backend, driver, fresh=True)
            if measured:
                return
            await ended.wait()

    async def _validate(self, batch: BatchRecord) -> bool:
        """Check the input file; True if the batch is now in progress."""
        content = await self.store.content(batch.input_file_id)
        now = self._wall()
        app = self._app(batch.app)
        if content is None or app is None:
            why = (
                BatchError(code="file_not_found", message="the input file has been deleted")
                if content is None
                else BatchError(
                    code="app_not_found", message=f"app {batch.app!r} is no longer configured"
                )
            )
            await self.store.fail(batch.id, [why], at=now)
            return False

        def route(model: str) -> str | None:
            backend = self.config.backend_for_model(model)
            return backend.name if backend is not None and app.may_use(model) else None

        def check() -> Checked:
            return check_input(
                content,
                endpoint=batch.endpoint,
                route=route,
                max_lines=self.config.jobs.batch_max_lines,
                max_request_bytes=self.config.jobs.max_request_bytes,
            )

        # A small file is checked at once; a large one off the event loop.
        inline = len(content) <= _INLINE_CHECK_BYTES
        checked = check() if inline else await trio.to_thread.run_sync(check)
        if checked.errors:
            await self.store.fail(batch.id, checked.errors, at=self._wall())
            return False
        if await self.store.start(batch.id, checked.lines, at=self._wall()):
            return True
        # Cancelled while it was being validated: it ends with no lines.
        return (await self.store.batch(batch.id)) is not None

    def _app(self, name: str) -> AppConfig | None:
        if not self.config.apps:
            return local_app(self.config)
        return self.config.apps.get(name)

    async def _submit(
        self, batch: BatchRecord, line: LineRecord, driver: _Driver, left: int
    ) -> LineRecord | None:
        """Make the line a job and queue it; None if it ended instead
        (cancelled or expired before it became one)."""
        await self._cancelled_elsewhere(batch.id, driver)
        if driver.cancelling:
            await self.store.record(
                line, outcome="error", output=error_line(line, "batch_cancelled", CANCELLED_MESSAGE)
            )
            return None
        mean, high, _ = await self._service(line.backend, driver)
        now = self._wall()
        start_by = batch.expires_at - high
        if now >= start_by:
            await self.store.record(
                line, outcome="expired", output=error_line(line, "batch_expired", EXPIRED_MESSAGE)
            )
            return None
        backend = self.config.backends.get(line.backend)
        slots = backend.slots if backend is not None else 1
        behind = now + math.ceil(left / max(1, slots)) * mean > start_by
        priority = batch.priority
        if not behind:
            low = self.config.scheduler.min_priority
            priority = max(low, batch.priority - self.config.jobs.batch_priority_drop)
        job_id = f"job_{batch.id.removeprefix('batch_')}_{line.idx}"
        job = await self.store.submit(
            line,
            job_id=job_id,
            app=batch.app,
            priority=priority,
            start_by=start_by,
            rerun_safe=batch.rerun_safe,
            created_at=now,
            path=batch.endpoint,
        )
        if job is None:
            # Only a second driver (this node declared gone while alive) gets here.
            return None
        # A cancel on another node that read the lines before this one became
        # a job has marked the batch first: it is seen now.
        await self._cancelled_elsewhere(batch.id, driver)
        while not driver.cancelling and not self._shared:
            try:
                self.jobs.enqueue(job)
                break
            except Rejected as exc:
                # The app's max_queued: the job waits on disk for a place.
                await trio.sleep(exc.retry_after_s or 1.0)
        if driver.cancelling:  # cancelled while it was being handed in
            await self._cancel_if_queued(job_id)
        return replace(line, job_id=job_id)

    async def _cancelled_elsewhere(self, batch_id: str, driver: _Driver) -> None:
        """In a cluster: mark the driver cancelling if the batch has been
        cancelled (perhaps on another node)."""
        if self._shared and not driver.cancelling:
            batch = await self.store.batch(batch_id)
            if batch is None or batch.status == "cancelling":
                driver.cancelling = True

    async def _service(
        self, backend: str, driver: _Driver, *, fresh: bool = False
    ) -> tuple[float, float, bool]:
        """(mean, high, measured?) service time of a line on ``backend``: of
        the latest jobs that ran there (read again every few seconds, or now if
        ``fresh``), else ``[scheduler] default_service_s``."""
        now = self._wall()
        known = driver.service.get(backend)
        if known is not None and not fresh and now - known[3] < _SERVICE_REFRESH_S:
            return known[0], known[1], known[2]
        times = await self.store.service_times(backend)
        if times:
            mean, high = sum(times) / len(times), max(times)
        else:
            mean = high = self.config.scheduler.default_service_s
        driver.service[backend] = (mean, high, bool(times), now)
        return mean, high, bool(times)

    async def _watch(self, line: LineRecord, driver: _Driver, room: trio.Semaphore) -> None:
        try:
            assert line.job_id is not None
            try:
                job = await self.jobs.wait_ended(line.job_id, app=None)
            except JobNotFound:
                output = error_line(line, "job_not_found", "the request's job no longer exists")
                await self.store.record(line, outcome="error", output=output)
                return
            if job.status == "cancelled":
                # Perhaps by a cancel of the batch on another node.
                await self._cancelled_elsewhere(line.batch_id, driver)
            result = await self.jobs.store.result(job.id)
            outcome, output = job_line(line, job, result, cancelling=driver.cancelling)
            with trio.CancelScope(shield=True):
                await self.store.record(line, outcome=outcome, output=output)
                # The output line holds the answer now: free the job's result
                # (and its place in the app's job quota).
                await self.jobs.store.forget_result(job.id)
        finally:
            driver.line_ended(line.backend)
            room.release()

    async def _finish(self, batch_id: str, driver: _Driver) -> None:
        batch = await self.store.batch(batch_id)
        if batch is None or batch.ended:
            return
        _, _, expired = await self.store.counts(batch_id)
        status: BatchStatus = "cancelled"
        if not driver.cancelling and batch.status != "cancelling":
            await self.store.mark_finalizing(batch_id, at=self._wall())
            status = "expired" if expired else "completed"
        hexid = uuid.uuid4().hex
        await self.store.finish(
            batch,
            status,
            at=self._wall(),
            output_file_id=f"file-{hexid}o",
            error_file_id=f"file-{hexid}e",
        )
        log.info("batch %s: %s", batch_id, status)


@asynccontextmanager
async def open_batches(jobs: Jobs, config: Config) -> AsyncIterator[Batches]:
    """The batch service over ``jobs`` (not yet running: start ``batches.run``
    with ``nursery.start`` after ``jobs.run``). On the way out it is stopped,
    before the job store closes."""
    batches = Batches(jobs=jobs, config=config)
    try:
        yield batches
    finally:
        with trio.CancelScope(shield=True):
            await batches.stop()
