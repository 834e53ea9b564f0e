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

import psycopg

from yard.cluster.pg import Row
from yard.cluster.schema import ENDED_CHANNEL, JOBS_CHANNEL
from yard.jobs.restore import INTERRUPTED

__all__ = ["ReapSummary", "reap_node"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReapSummary:
    """What :meth:`yard.cluster.jobs.PgJobStore.reap` did with a dead node's jobs (their ids)."""

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


def reap_node(conn: psycopg.Connection[Row], node: str, now: float) -> ReapSummary:
    """Apply the restart rules to the jobs ``node`` held (see the module
    rules), in the caller's transaction."""
    released = conn.execute(
        "UPDATE jobs SET claimed_by = NULL, claimed_at = NULL "
        "WHERE claimed_by = %s AND status = 'queued' RETURNING id, backend",
        (node,),
    ).fetchall()
    rerun = conn.execute(
        "UPDATE jobs SET status = 'queued', rerun_used = true, started_at = NULL, "
        "claimed_by = NULL, claimed_at = NULL "
        "WHERE claimed_by = %s AND status = 'running' AND rerun_safe AND NOT rerun_used "
        "RETURNING id, backend",
        (node,),
    ).fetchall()
    interrupted = [
        str(row[0])
        for row in conn.execute(
            "UPDATE jobs SET status = 'failed', finished_at = %s, error_code = %s, "
            "error_message = %s, error_status = %s "
            "WHERE claimed_by = %s AND status = 'running' RETURNING id",
            (
                now,
                INTERRUPTED.code,
                INTERRUPTED.message,
                INTERRUPTED.status,
                node,
            ),
        )
    ]
    conn.execute("DELETE FROM job_requests WHERE job_id = ANY(%s)", (interrupted,))
    for job_id in interrupted:
        conn.execute("SELECT pg_notify(%s, %s)", (ENDED_CHANNEL, job_id))
    for backend in sorted({str(row[1]) for row in (*released, *rerun)}):
        conn.execute("SELECT pg_notify(%s, %s)", (JOBS_CHANNEL, backend))
    return ReapSummary(
        released=tuple(str(row[0]) for row in released),
        rerun=tuple(str(row[0]) for row in rerun),
        interrupted=tuple(interrupted),
    )
