"""What becomes of a dead node's jobs: the restart rules, applied by another node.

A node found dead (no heartbeat within the cluster's limit) may still hold
jobs: claimed ones waiting in its own queue and running ones. Another node
applies to them the rules of a restart (:mod:`yard.jobs.restore`): queued
ones go back unclaimed with their rank and seq (their old place); running ones
end ``failed`` with code ``interrupted``, unless rerun-safe with the rerun
unused, in which case they go back once. Several reapers at once are safe:
row locks and the conditions let exactly one move each job. Every end is
announced (``NOTIFY yard_job_ended``) and the backends of the jobs put back
are woken (``NOTIFY yard_jobs``), in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from yard.db import Tx
from yard.jobs.restore import INTERRUPTED
from yard.jobs.schema import ENDED_CHANNEL, JOBS_CHANNEL

__all__ = ["ReapSummary", "reap_node"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReapSummary:
    """What :meth:`yard.cluster.jobs.ClusterJobStore.reap` did with a dead
    node's jobs (their ids)."""

    released: tuple[str, ...] = ()
    rerun: tuple[str, ...] = ()
    interrupted: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return len(self.released) + len(self.rerun) + len(self.interrupted)

    def describe(self) -> str:
        return (
            f"{len(self.released)} queued back to the shared queue, {len(self.rerun)} rerun "
            f"(marked rerun-safe), {len(self.interrupted)} interrupted"
        )


def reap_node(tx: Tx, node: str, now: float) -> ReapSummary:
    """Apply the restart rules to the jobs ``node`` held (see the module
    rules), in the caller's transaction."""
    released = tx.execute(
        "UPDATE jobs SET claimed_by = NULL, claimed_at = NULL "
        "WHERE claimed_by = ? AND status = 'queued' RETURNING id, backend",
        (node,),
    ).fetchall()
    rerun = tx.execute(
        "UPDATE jobs SET status = 'queued', rerun_used = true, started_at = NULL, "
        "claimed_by = NULL, claimed_at = NULL "
        "WHERE claimed_by = ? AND status = 'running' AND rerun_safe AND NOT rerun_used "
        "RETURNING id, backend",
        (node,),
    ).fetchall()
    interrupted = [
        str(row[0])
        for row in tx.execute(
            "UPDATE jobs SET status = 'failed', finished_at = ?, error_code = ?, "
            "error_message = ?, error_status = ? "
            "WHERE claimed_by = ? AND status = 'running' RETURNING id",
            (
                now,
                INTERRUPTED.code,
                INTERRUPTED.message,
                INTERRUPTED.status,
                node,
            ),
        ).fetchall()
    ]
    tx.execute("DELETE FROM job_requests WHERE job_id = ANY(?)", (interrupted,))
    for job_id in interrupted:
        tx.notify(ENDED_CHANNEL, job_id)
    for backend in sorted({str(row[1]) for row in (*released, *rerun)}):
        tx.notify(JOBS_CHANNEL, backend)
    return ReapSummary(
        released=tuple(str(row[0]) for row in released),
        rerun=tuple(str(row[0]) for row in rerun),
        interrupted=tuple(interrupted),
    )
