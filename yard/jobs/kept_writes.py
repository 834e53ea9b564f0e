"""Writes the database did not take, kept until it is back.

A cluster node's job service writes to a shared PostgreSQL that can be lost
or busy for a while (one yard's SQLite is neither). Rules kept here:

- A write the database does not take because it is lost or busy
  (:func:`yard.db.passing`) is kept and made again every ``retry_s`` until
  it is back. A write the database refuses (any other error) is logged once
  and not made again.
- Each is logged for people: when the wait begins, every ``log_every_s``
  while it lasts, with how long it has waited, and when it is over.
- Only yard's stop ends a wait (the waits are not shielded); what was not
  written then is left to the node that reaps this one.

The writes kept: a job's end (:meth:`KeptWrites.finish`), and a job given
back to the shared queue unrun, or after the core requeued it
(:meth:`KeptWrites.give_back`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from yard.db import DatabaseError, passing
from yard.jobs.records import JobError, Status, StoredResult
from yard.jobs.store import JobStore

__all__ = ["KeptWrites"]

log = logging.getLogger("yard.jobs")

T = TypeVar("T")


class KeptWrites:
    """The kept writes of one job service (see the module rules).

    store: the job store.
    release: gives a claimed job back to the shared queue (True if it was).
    retry_s: how often a kept write is made again.
    log_every_s: while it keeps failing, how often the log says so again.
    """

    def __init__(
        self,
        store: JobStore,
        *,
        release: Callable[[str], Awaitable[bool]],
        retry_s: float,
        log_every_s: float,
    ) -> None:
        self._store = store
        self._release = release
        self._retry_s = retry_s
        self._log_every_s = log_every_s
        self.unwritten = 0
        """How many jobs' ends are kept now, waiting for the database."""

    async def finish(
        self,
        job_id: str,
        status: Status,
        *,
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
        store = self._store
        self.unwritten += 1
        try:
            won = await self._when_back(
                job_id,
                "record its end",
                lambda: store.end_run(job_id, status, at=at, error=error, result=result),
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
                return await store.end_run(job_id, "failed", at=at, error=plain)

            try:
                won = await fail()
            except DatabaseError as refused:
                won = await self._when_back(job_id, "record that it failed", fail, refused)
            return "failed" if won else None
        finally:
            self.unwritten -= 1

    async def give_back(self, job_id: str, exc: DatabaseError, *, requeued: bool = False) -> None:
        """Give a job claimed here back to the shared queue, at its old place,
        once the database is back (``exc``: why it could not be done now): one
        that has not run, or, with ``requeued``, one the core requeued after
        its backend was lost, marked so first (running -> queued, its one
        requeue spent)."""
        release = self._release
        store = self._store

        async def back() -> bool:
            if requeued:
                await store.mark_requeued(job_id)
            return await release(job_id)

        what = "record its requeue and give it back" if requeued else "give it back"
        given = await self._when_back(job_id, f"{what} to the shared queue", back, exc)
        if given is False:
            log.info(
                "job %s: not given back: it ended or moved while the database was lost", job_id
            )

    async def _when_back(
        self,
        job_id: str,
        what: str,
        write: Callable[[], Awaitable[T]],
        exc: DatabaseError,
    ) -> T | None:
        """Make ``write`` (which just failed with ``exc``) again every
        ``retry_s`` while the shared database is lost or busy, and return
        what it returns once it works. None once the database refuses it
        (an error that is not lost or busy), logged once at error level.

        ``what`` completes "job ID: cannot ..." in the log."""
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
            self._retry_s,
        )
        while True:
            await trio.sleep(self._retry_s)
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
                if trio.current_time() - logged >= self._log_every_s:
                    logged = trio.current_time()
                    log.warning(
                        "job %s: still cannot %s after %.0f s (%s); retrying every %g s",
                        job_id,
                        what,
                        waited,
                        again,
                        self._retry_s,
                    )
                continue
            log.info(
                "job %s: could %s after %.0f s (the database is back)",
                job_id,
                what,
                trio.current_time() - began,
            )
            return value
