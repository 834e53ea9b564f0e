"""Bringing the jobs of the last run back after a restart (even after SIGKILL).

Rules, for each job that had not ended, in arrival order:

- queued: back into the engine's queue at its old place: its original
  arrival (so aging keeps counting from the stored epoch), its deadline, and
  its ``requeued`` flag (a job that already had its one OOM requeue never
  gets a second).
- running: yard died while its request was upstream, so it may or may not
  have run. yard never retries on its own: it ends as ``failed`` with code
  ``interrupted``, unless the client marked it rerun-safe when handing it in;
  such a job goes back to its old place once (``rerun_used`` is stored, so a
  second crash ends it as interrupted).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Protocol

from yard.errors import Rejected
from yard.jobs.store import JobError, JobRecord, JobStore

log = logging.getLogger("yard.jobs")


@dataclass(frozen=True, slots=True, kw_only=True)
class RestoreSummary:
    """What a restart did with the jobs it found."""

    queued: int = 0
    rerun: int = 0
    interrupted: int = 0
    refused: int = 0

    @property
    def total(self) -> int:
        return self.queued + self.rerun + self.interrupted + self.refused

    def describe(self) -> str:
        return (
            f"{self.queued} back in the queue, {self.rerun} rerun (marked rerun-safe), "
            f"{self.interrupted} interrupted, {self.refused} refused by the scheduler"
        )


class Restorable(Protocol):
    """What a restart needs of the job service (:class:`yard.jobs.service.Jobs`)."""

    @property
    def store(self) -> JobStore: ...

    def now(self) -> float: ...

    def enqueue(self, job: JobRecord, *, arrived_at_wall: float | None = None) -> None: ...


INTERRUPTED = JobError(
    code="interrupted",
    message="yard stopped while this job was running, so it may or may not have run; "
    "yard does not run it again on its own (hand it in with 'Prefer: respond-async, "
    "rerun-safe' to allow one rerun after a restart)",
    status=503,
)


async def restore(jobs: Restorable) -> RestoreSummary:
    """Put every unfinished job of ``jobs.store`` back (see the module rules).
    Called by :meth:`yard.jobs.service.Jobs.run` before it reports ready."""
    counts = {"queued": 0, "rerun": 0, "interrupted": 0, "refused": 0}
    for job in await jobs.store.unfinished():
        kind = "queued"
        if job.status == "running":
            if not (job.rerun_safe and not job.rerun_used and await jobs.store.mark_rerun(job.id)):
                if await jobs.store.finish(job.id, "failed", at=jobs.now(), error=INTERRUPTED):
                    counts["interrupted"] += 1
                continue
            job = dataclasses.replace(job, status="queued", rerun_used=True, started_at=None)
            kind = "rerun"
        try:
            jobs.enqueue(job, arrived_at_wall=job.created_at)
        except Rejected as exc:
            kind = "refused"
            await jobs.store.finish(
                job.id,
                "failed",
                at=jobs.now(),
                error=JobError(code=exc.code, message=exc.message, status=exc.status),
            )
        counts[kind] += 1
    return RestoreSummary(**counts)
