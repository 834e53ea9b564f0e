"""Durable async jobs: hand a request in now, fetch its result later.

Layout:

- ``records``: a job as stored, its request, result and error, an app's
  quota; ``store``: the SQLite record of them (``data_dir/jobs.sqlite``),
  its tables in ``schema``, a row read into a record by ``rows`` (shared with
  the cluster's PostgreSQL store).
- ``service``: :class:`Jobs`, the :class:`~yard.http.ports.JobService` the
  proxy hands ``Prefer: respond-async`` requests to, and the reaper that
  expires old results; ``refusals``: what a client is told when a job is
  not taken.
- ``runner``: the task per job that takes it through its turn
  (:func:`yard.admission.run_turn`) and ends it; ``kept_writes``: the writes
  a cluster's shared database did not take, made again once it is back.
- ``upstream``: a job's request to its backend, and its whole answer back.
- ``restore``: what a restart does with the jobs the last run left.
- ``views``: a job as JSON; ``api``: the ``/v1/jobs`` blueprint; ``cli``:
  ``yard jobs``. The settings are :class:`yard.config.JobsConfig` (``[jobs]``).

``yard serve`` uses it like this (after the engine has started)::

    async with open_jobs(engine=engine, data_dir=config.server.data_dir,
                         pool=pool, config=config.jobs) as jobs:
        await nursery.start(jobs.run)
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from yard.config import JobsConfig
from yard.h1.upstream import UpstreamPool
from yard.jobs.service import EngineLike, Jobs
from yard.jobs.store import JobStore

__all__ = ["JOBS_FILE", "JobStore", "Jobs", "JobsConfig", "open_jobs"]

JOBS_FILE = "jobs.sqlite"


@asynccontextmanager
async def open_jobs(
    *,
    engine: EngineLike,
    data_dir: Path,
    pool: UpstreamPool | None = None,
    config: JobsConfig | None = None,
    wall: Callable[[], float] | None = None,
) -> AsyncIterator[Jobs]:
    """Open the job store in ``data_dir`` and yield the job service (not yet
    running: start ``jobs.run`` with ``nursery.start``). On the way out the
    service is stopped and the store closed.

    config: the ``[jobs]`` settings (``Config.jobs``); None: the defaults.
    pool: the connections to backends (``yard serve`` shares the gateway's);
        None: a pool of its own, whose idle connections close on the way out.
    """
    own_pool = UpstreamPool() if pool is None else None
    store = await JobStore.open(data_dir / JOBS_FILE)
    jobs = Jobs(
        engine=engine,
        store=store,
        pool=pool or own_pool,
        config=config or JobsConfig(),
        wall=wall or time.time,
    )
    try:
        yield jobs
    finally:
        with trio.CancelScope(shield=True):
            # The caller may leave before the nursery running jobs.run has
            # wound down, and runners still write to the store as they stop.
            await jobs.stop()
            await store.close()
            if own_pool is not None:
                own_pool.close_idle()
