"""The batch service: OpenAI's Batch API on top of durable jobs.

Theory of operation. ``POST /v1/batches`` records the batch as
``validating`` (synced to disk) and answers. A driver task per batch
(:class:`~yard.batches.driver.BatchDriver`) then validates it, hands its
lines to the job service as jobs, records each line's outcome as its job
ends, and writes the output and error files; that module tells how the
completion window, the lines' priority and their order by model work.

A restart (even after SIGKILL) picks every batch that has not ended up where
it was: validation again if it had not finished, else the job service has
already put the lines' jobs back, and the driver watches them and feeds the
rest.

In a cluster (the store a :class:`~yard.cluster.batches.ClusterBatchStore`),
files, batches and lines live in the shared database, so any node reads and
cancels any batch. A line becomes a job of the shared queue, unclaimed, and whichever
node can serve it soonest claims it (this node does not enqueue it itself).
One node drives a batch: the one it was created on, until it stops or is
declared gone in the node registry; every ``[cluster] heartbeat_s`` each node
adopts the batches nobody alive drives, drops the drivers of batches another
node has taken, and sees cancels made on other nodes. A second driver for a
while is harmless: each line becomes a job once and ends once.
"""

from __future__ import annotations

import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from yard.batches.driver import BatchDriver, cancel_if_queued
from yard.batches.records import ENDPOINTS, BatchRecord, FileRecord
from yard.batches.store import BatchStore, FileLimit
from yard.batches.validate import BadRequest, check_metadata
from yard.config import AppConfig, Config, local_app
from yard.db import DatabaseError, passing
from yard.jobs.service import Jobs

log = logging.getLogger("yard.batches")

_WINDOW = re.compile(r"([1-9][0-9]{0,5})h")


class Batches:
    """The batch service. Build it, then start :meth:`run` with
    ``nursery.start`` after the job service is running.

    jobs: the job service (running); lines become its jobs.
    config: the whole configuration (``[jobs]`` batch keys, apps, backends).
    store: the batch tables, beside the jobs (lines become jobs in the same
        transaction as their line's state); default: in the job store's
        database (:class:`BatchStore`).
    wall: the wall clock (``time.time``).
    """

    def __init__(
        self,
        *,
        jobs: Jobs,
        config: Config,
        store: BatchStore | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.jobs = jobs
        self.store = store or BatchStore(jobs.store)
        self.config = config
        self._wall = wall
        self._nursery: trio.Nursery | None = None
        self._drivers: dict[str, BatchDriver] = {}
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
                        if self.config.cluster is not None:
                            nursery.start_soon(self._look_around, self.config.cluster.heartbeat_s)
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
            if not await self.store.adopt(batch.id):
                continue
            self._drive(batch)

    async def _look_around(self, every: float) -> None:
        """A cluster node, every ``[cluster] heartbeat_s``: adopt the batches
        whose driver is gone, stop driving those another node took over, and
        hear of cancels made on another node."""
        store = self.store
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
            try:
                await self.store.release()
            except DatabaseError as exc:
                log.warning("batches: could not give the batches up as it stopped (%s)", exc)

    def _drive(self, batch: BatchRecord) -> None:
        if self._nursery is None or batch.id in self._drivers:
            return
        driver = BatchDriver(
            batch.id,
            jobs=self.jobs,
            store=self.store,
            config=self.config,
            app_of=self._app,
            wall=self._wall,
            cancelling=batch.status == "cancelling",
        )
        self._drivers[batch.id] = driver
        self._nursery.start_soon(self._run_batch, driver)

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
            # Its lines not yet jobs end at once, a chunk per transaction; of
            # the rest it knows which are jobs (no read of every line).
            driver.cancelling = True
            job_ids = sorted(driver.watching)
        else:
            job_ids = await self.store.unended_job_ids(batch.id)
        for job_id in job_ids:
            await cancel_if_queued(self.jobs, job_id)
        return await self.get(batch_id, app=app)

    # -- drivers -------------------------------------------------------------

    async def _run_batch(self, driver: BatchDriver) -> None:
        try:
            with driver.scope:
                await driver.run()
        except Exception as exc:
            if _passing(exc):
                # The cluster's database is away or busy: the batch stays as
                # stored and a node adopts it again (this one included).
                log.warning("batch %s: driver stopped (%s)", driver.batch_id, exc)
                return
            # A bug or a disk that refuses writes: a restart would fail the
            # same way, so the batch ends failed, with the reason.
            log.exception("batch %s: driver failed", driver.batch_id)
            try:
                with trio.CancelScope(shield=True):
                    await driver.fail(_reason(exc))
            except Exception:
                log.exception("batch %s: could not record its failure", driver.batch_id)
        finally:
            self._drivers.pop(driver.batch_id, None)

    def _app(self, name: str) -> AppConfig | None:
        if not self.config.apps:
            return local_app(self.config)
        return self.config.apps.get(name)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _passing(exc: BaseException) -> bool:
    """Whether every error in ``exc`` may pass by itself (the shared database away)."""
    return all(passing(leaf) for leaf in _leaves(exc))


def _reason(exc: BaseException) -> str:
    """The failure in a few words, for the batch's ``errors``."""
    leaf = _leaves(exc)[0]
    text = f"{type(leaf).__name__}: {leaf}"
    return text if len(text) <= 200 else text[:197] + "..."


@asynccontextmanager
async def open_batches(
    jobs: Jobs, config: Config, store: BatchStore | None = None
) -> AsyncIterator[Batches]:
    """The batch service over ``jobs`` and ``store`` (not yet running: start
    ``batches.run`` with ``nursery.start`` after ``jobs.run``). On the way out
    it is stopped, before the job store closes."""
    batches = Batches(jobs=jobs, config=config, store=store)
    try:
        yield batches
    finally:
        with trio.CancelScope(shield=True):
            await batches.stop()
