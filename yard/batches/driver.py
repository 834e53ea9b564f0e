"""One batch driven from ``validating`` to its end: :class:`BatchDriver`.

The batch service (:mod:`yard.batches.service`) starts one driver per batch
that has not ended; the driver:

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

Everything a driver does is on disk as it goes: a driver cut at any point
(a crash, a stop, another node taking the batch over) leaves the batch as
stored, and its next driver (after a restart, or on the node that adopts it)
goes on from there; a second driver for a while is harmless.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import trio

from yard.batches.records import BatchError, BatchRecord, BatchStatus, LineRecord, ParsedLines
from yard.batches.store import BatchStore
from yard.batches.validate import Checked, check_input
from yard.batches.views import CANCELLED_MESSAGE, EXPIRED_MESSAGE, error_line, job_line
from yard.config import AppConfig, Config
from yard.errors import Rejected
from yard.jobs.service import JobFinished, JobNotFound, Jobs

log = logging.getLogger("yard.batches")

_SERVICE_REFRESH_S = 5.0
_INLINE_CHECK_BYTES = 256 * 2**10
_RECORD_CHUNK = 1000  # outcomes of lines that never became jobs, per transaction
_PAGE = 250  # lines read at once (a cancelled page's outcomes are made in one loop step)
_FREE_CHUNK = 1000  # checked lines freed at once (about 0.3 ms for 1 KiB lines)


def _hand_over_the_gil() -> None:
    time.sleep(0)


async def cancel_if_queued(jobs: Jobs, job_id: str) -> None:
    """Cancel the job if it is still queued (a running one finishes)."""
    job = await jobs.store.get(job_id)
    if job is not None and job.status == "queued":
        with contextlib.suppress(JobFinished, JobNotFound):
            await jobs.cancel(job_id, app=None)


class BatchDriver:
    """Drives one batch to its end: build it, then ``await`` :meth:`run`
    inside :attr:`scope` (cancel the scope to stop it; what it did is on disk).

    batch_id: the batch.
    jobs: the job service (running); lines become its jobs.
    store: where the batch and its lines are.
    config: the whole configuration (``[jobs]`` batch keys, backends, scheduler).
    app_of: the configuration of an app by name, None if it is gone.
    wall: the wall clock.
    cancelling: the batch is being cancelled already.
    """

    def __init__(
        self,
        batch_id: str,
        *,
        jobs: Jobs,
        store: BatchStore,
        config: Config,
        app_of: Callable[[str], AppConfig | None],
        wall: Callable[[], float],
        cancelling: bool,
    ) -> None:
        self.batch_id = batch_id
        # Set by a cancel of the batch: lines not yet jobs end batch_cancelled
        # and the batch ends cancelled.
        self.cancelling = cancelling
        self.scope = trio.CancelScope()
        self._jobs = jobs
        self._store = store
        self._config = config
        self._app_of = app_of
        self._wall = wall
        # backend -> (mean, high, measured?, when read) service time figures.
        self._service: dict[str, tuple[float, float, bool, float]] = {}
        # Lines queued or running per backend, and an event set when one ends.
        self._inflight: Counter[str] = Counter()
        self._ended = trio.Event()
        # Lines ended without becoming jobs, not yet written.
        self._unsubmitted: list[tuple[LineRecord, str, str]] = []
        self._watching: set[str] = set()

    @property
    def watching(self) -> frozenset[str]:
        """The job ids of this batch's lines that are jobs and have not ended
        (what a cancel of the batch cancels), as this driver knows them."""
        return frozenset(self._watching)

    async def run(self) -> None:
        """Validate the batch if it is new, hand in its lines, watch them end
        and write its files. Returns at once if it has ended."""
        batch = await self._store.batch(self.batch_id)
        if batch is None or batch.ended:
            return
        if batch.status == "validating" and not await self._validate(batch):
            return
        left = Counter(await self._store.unended_per_backend(self.batch_id))
        room = trio.Semaphore(self._config.jobs.batch_queued_lines)
        async with trio.open_nursery() as nursery:
            after = -1
            while True:
                # A page of lines at a time, read off the event loop: all
                # 50,000 of a big batch in memory at once made the garbage
                # collector scan the whole heap (~100 ms holding the GIL), and
                # each pass over them held the loop 5-10 ms.
                page = await self._store.unended_lines(self.batch_id, after=after, limit=_PAGE)
                for line in page:
                    await self._feed(batch, line, left, room, nursery)
                if len(page) < _PAGE:
                    break
                after = page[-1].idx
            await self._record_unsubmitted()
        await self._finish()

    async def _feed(
        self,
        batch: BatchRecord,
        line: LineRecord,
        left: Counter[str],
        room: trio.Semaphore,
        nursery: trio.Nursery,
    ) -> None:
        """Hand ``line`` in once there is room (or end it unsubmitted) and
        watch it; ``left`` counts the lines per backend not yet handed in."""
        if line.job_id is None and await self._ends_unsubmitted(batch, line):
            # Cancelled or expired before it became a job: its outcome is
            # written with its neighbours', a chunk per transaction.
            left[line.backend] -= 1
            if len(self._unsubmitted) >= _RECORD_CHUNK:
                await self._record_unsubmitted()
            return
        await self._record_unsubmitted()
        await room.acquire()
        if line.job_id is None:
            await self._first_measurement(line.backend)
            submitted = await self._submit(batch, line, left[line.backend])
            left[line.backend] -= 1
            if submitted is None:
                room.release()
                return
            line = submitted
        else:
            left[line.backend] -= 1
        self._inflight[line.backend] += 1
        assert line.job_id is not None
        self._watching.add(line.job_id)
        nursery.start_soon(self._watch, line, room)

    async def _ends_unsubmitted(self, batch: BatchRecord, line: LineRecord) -> bool:
        """Whether ``line`` (not yet a job) ends now without becoming one: the
        batch is cancelling, or the line can no longer start in its window.
        If so its outcome is queued for :meth:`_record_unsubmitted`."""
        await self._cancelled_elsewhere()
        if self.cancelling:
            output = error_line(line, "batch_cancelled", CANCELLED_MESSAGE)
            self._unsubmitted.append((line, "error", output))
            return True
        _, high, _ = await self._service_time(line.backend)
        if self._wall() >= batch.expires_at - high:
            output = error_line(line, "batch_expired", EXPIRED_MESSAGE)
            self._unsubmitted.append((line, "expired", output))
            return True
        return False

    async def _record_unsubmitted(self) -> None:
        """Write the outcomes :meth:`_ends_unsubmitted` queued, in one
        transaction (a driver cut before it writes them again: same outcome)."""
        if self._unsubmitted:
            chunk, self._unsubmitted = self._unsubmitted, []
            with trio.CancelScope(shield=True):
                await self._store.record_many(chunk)

    def _line_ended(self, backend: str) -> None:
        self._inflight[backend] -= 1
        self._ended.set()
        self._ended = trio.Event()

    async def _first_measurement(self, backend: str) -> None:
        """Until a run on ``backend`` has been measured, hand in no more of
        this batch's lines there than it has slots: a line's start-by is fixed
        when it is handed in, and the default service time may be far off."""
        config = self._config.backends.get(backend)
        slots = config.slots if config is not None else 1
        while self._inflight[backend] >= slots:
            # Taken before the read below: a line that ends meanwhile sets it.
            ended = self._ended
            _, _, measured = await self._service_time(backend, fresh=True)
            if measured:
                return
            await ended.wait()

    async def _validate(self, batch: BatchRecord) -> bool:
        """Check the input file; True if the batch is now in progress."""
        content = await self._store.content(batch.input_file_id)
        now = self._wall()
        app = self._app_of(batch.app)
        if content is None or app is None:
            why = (
                BatchError(code="file_not_found", message="the input file has been deleted")
                if content is None
                else BatchError(
                    code="app_not_found", message=f"app {batch.app!r} is no longer configured"
                )
            )
            await self._store.fail(batch.id, [why], at=now)
            return False

        def route(model: str) -> str | None:
            backend = self._config.backend_for_model(model)
            return backend.name if backend is not None and app.may_use(model) else None

        def check(pause: Callable[[], None] | None = None) -> Checked:
            return check_input(
                content,
                endpoint=batch.endpoint,
                route=route,
                max_lines=self._config.jobs.batch_max_lines,
                max_request_bytes=self._config.jobs.max_request_bytes,
                pause=pause,
            )

        async def start(lines: ParsedLines) -> bool:
            return await self._store.start(batch.id, lines, at=self._wall())

        def check_and_start() -> tuple[BatchError, ...] | bool:
            # In a worker thread, and the GIL goes to the loop every few
            # lines (see check_input). Freeing the lines holds the GIL as
            # well, in any thread: 15 ms for 50,000 lines of 1 KiB at once,
            # so they go a few at a time.
            checked = check(pause=_hand_over_the_gil)
            if checked.errors:
                return checked.errors
            started = trio.from_thread.run(start, checked.lines)
            rows = list(checked.lines.rows)
            del checked  # the lines now live in rows only
            while rows:
                del rows[-_FREE_CHUNK:]
                _hand_over_the_gil()
            return started

        if len(content) <= _INLINE_CHECK_BYTES:  # a small file is checked at once
            checked = check()
            outcome = checked.errors or await start(checked.lines)
        else:
            outcome = await trio.to_thread.run_sync(check_and_start)
        if isinstance(outcome, tuple):
            await self._store.fail(batch.id, outcome, at=self._wall())
            return False
        if outcome:
            return True
        # Cancelled while it was being validated: it ends with no lines.
        return (await self._store.batch(batch.id)) is not None

    async def _submit(self, batch: BatchRecord, line: LineRecord, left: int) -> LineRecord | None:
        """Make the line a job and queue it; None if it ended instead
        (cancelled or expired before it became one)."""
        await self._cancelled_elsewhere()
        if self.cancelling:
            await self._store.record(
                line, outcome="error", output=error_line(line, "batch_cancelled", CANCELLED_MESSAGE)
            )
            return None
        mean, high, _ = await self._service_time(line.backend)
        now = self._wall()
        start_by = batch.expires_at - high
        if now >= start_by:
            await self._store.record(
                line, outcome="expired", output=error_line(line, "batch_expired", EXPIRED_MESSAGE)
            )
            return None
        backend = self._config.backends.get(line.backend)
        slots = backend.slots if backend is not None else 1
        behind = now + math.ceil(left / max(1, slots)) * mean > start_by
        priority = batch.priority
        if not behind:
            low = self._config.scheduler.min_priority
            priority = max(low, batch.priority - self._config.jobs.batch_priority_drop)
        job_id = f"job_{batch.id.removeprefix('batch_')}_{line.idx}"
        job = await self._store.submit(
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
        await self._cancelled_elsewhere()
        while not self.cancelling:
            try:
                self._jobs.hand_in(job)
                break
            except Rejected as exc:
                # The app's max_queued: the job waits on disk for a place.
                await trio.sleep(exc.retry_after_s or 1.0)
        if self.cancelling:  # cancelled while it was being handed in
            await cancel_if_queued(self._jobs, job_id)
        return replace(line, job_id=job_id)

    async def _cancelled_elsewhere(self) -> None:
        """Mark the driver cancelling if the batch has been cancelled on
        another node (of a cluster)."""
        if not self.cancelling and await self._store.cancelled_elsewhere(self.batch_id):
            self.cancelling = True

    async def _service_time(
        self, backend: str, *, fresh: bool = False
    ) -> tuple[float, float, bool]:
        """(mean, high, measured?) service time of a line on ``backend``: of
        the latest jobs that ran there (read again every few seconds, or now if
        ``fresh``), else ``[scheduler] default_service_s``."""
        now = self._wall()
        known = self._service.get(backend)
        if known is not None and not fresh and now - known[3] < _SERVICE_REFRESH_S:
            return known[0], known[1], known[2]
        times = await self._store.service_times(backend)
        if times:
            mean, high = sum(times) / len(times), max(times)
        else:
            mean = high = self._config.scheduler.default_service_s
        self._service[backend] = (mean, high, bool(times), now)
        return mean, high, bool(times)

    async def _watch(self, line: LineRecord, room: trio.Semaphore) -> None:
        try:
            assert line.job_id is not None
            try:
                job = await self._jobs.wait_ended(line.job_id, app=None)
            except JobNotFound:
                output = error_line(line, "job_not_found", "the request's job no longer exists")
                await self._store.record(line, outcome="error", output=output)
                return
            if job.status == "cancelled":
                # Perhaps by a cancel of the batch on another node.
                await self._cancelled_elsewhere()
            result = await self._jobs.store.result(job.id)
            outcome, output = job_line(line, job, result, cancelling=self.cancelling)
            with trio.CancelScope(shield=True):
                await self._store.record(line, outcome=outcome, output=output)
                # The output line holds the answer now: free the job's result
                # (and its place in the app's job quota).
                await self._jobs.store.forget_result(job.id)
        finally:
            self._watching.discard(line.job_id)
            self._line_ended(line.backend)
            room.release()

    async def fail(self, reason: str) -> None:
        """End the batch ``failed`` with ``reason`` after its driver failed
        (a bug, a disk that refuses writes): its lines still queued are
        cancelled, running ones finish unrecorded, and the lines that had
        ended go to its output and error files. Without this the batch would
        stay unended until a restart, which would fail it the same way."""
        batch = await self._store.batch(self.batch_id)
        if batch is None or batch.ended:
            return
        for job_id in await self._store.unended_job_ids(self.batch_id):
            await cancel_if_queued(self._jobs, job_id)
        error = BatchError(
            code="batch_failed",
            message=f"yard could not drive this batch to its end ({reason}); the lines that "
            "had finished are in its output and error files: hand the others in again as "
            "a new batch",
        )
        if batch.status == "validating":
            await self._store.fail(self.batch_id, [error], at=self._wall())
            return
        hexid = uuid.uuid4().hex
        await self._store.finish(
            batch,
            "failed",
            at=self._wall(),
            output_file_id=f"file-{hexid}o",
            error_file_id=f"file-{hexid}e",
            errors=[error],
        )

    async def _finish(self) -> None:
        batch = await self._store.batch(self.batch_id)
        if batch is None or batch.ended:
            return
        _, _, expired = await self._store.counts(self.batch_id)
        status: BatchStatus = "cancelled"
        if not self.cancelling and batch.status != "cancelling":
            await self._store.mark_finalizing(self.batch_id, at=self._wall())
            status = "expired" if expired else "completed"
        hexid = uuid.uuid4().hex
        await self._store.finish(
            batch,
            status,
            at=self._wall(),
            output_file_id=f"file-{hexid}o",
            error_file_id=f"file-{hexid}e",
        )
        log.info("batch %s: %s", self.batch_id, status)
