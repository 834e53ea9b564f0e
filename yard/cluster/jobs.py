"""The jobs of a cluster: one shared queue in one priority order, with claims.

:class:`ClusterJobStore` is the job store (:class:`yard.jobs.store.JobStore`,
whose queries and rules it keeps) on the cluster's PostgreSQL, as seen from
one node. What it adds:

- **One order.** With linear aging a waiting job's effective priority is
  ``priority + aging_rate * (now - created_at)``; the part that differs
  between jobs, ``rank = priority - aging_rate * created_at``, never changes.
  So one index (``jobs_waiting``) orders every node's waiting jobs, and a job
  handed to node 1 with a higher rank is claimed before a lower one handed to
  node 2, whichever node claims.
- **Claims.** A job is inserted unclaimed (``NOTIFY yard_jobs, backend`` in
  the same transaction, so a listener never wakes before the row is
  visible). :meth:`ClusterJobStore.claim` takes the best unclaimed queued job
  of the given backends with ``FOR UPDATE SKIP LOCKED``: two nodes claiming
  at once never get the same job and never wait for each other. A claimed job
  stays ``queued`` in the claiming node's own queue until it runs.
- **A job runs on one node.** :meth:`ClusterJobStore.mark_running` requires
  the job to be queued and claimed by this node (or by none, and then claims
  it): a node that was declared dead and reaped, but still holds the job in
  memory, finds it gone (or already running) instead of running it a second
  time; :meth:`~ClusterJobStore.mark_requeued` moves only a job running here.
- **Dead nodes.** :meth:`ClusterJobStore.reap` applies the rules of a restart
  to the jobs a dead node held (:mod:`yard.cluster.reaping`);
  :meth:`ClusterJobStore.reap_gone` declares the node gone in the same
  transaction, so no node sees it gone while it still holds jobs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from yard.cluster.pg import PgDatabase
from yard.cluster.reaping import ReapSummary, reap_node
from yard.db import Tx
from yard.jobs.records import JobError, JobRecord, Status, StoredResult
from yard.jobs.rows import COLUMNS, job_record
from yard.jobs.schema import JOBS_CHANNEL
from yard.jobs.service import Jobs
from yard.jobs.store import JobStore

__all__ = ["ClusterJobStore", "SharedQueue", "rank_of"]

_UNCLAIMED = "status = 'queued' AND claimed_by IS NULL"
"""The jobs a claim may take (the rows of the ``jobs_queue`` index)."""
_BEST = f"""
    SELECT top.seq FROM unnest(?::text[]) AS wanted (backend)
    CROSS JOIN LATERAL (
        SELECT seq, rank, backend FROM jobs
        WHERE {_UNCLAIMED} AND backend = wanted.backend
        ORDER BY rank DESC, seq LIMIT 1
    ) AS top
    ORDER BY top.rank DESC, top.backend = ANY(?) DESC, top.seq
    LIMIT 1
"""
"""The best unclaimed job of the backends (a preferred backend first among
equal ranks), read without locking it. Parameters: backends, prefer."""
_LAZY_COMMIT = "(SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit"
"""Joined into a one-statement transaction, its commit does not wait for the
disk: for claims, whose loss in a crash of the database only gives the job
back to the shared queue (every later change of the job, such as
mark_running, is synced, and syncing it syncs the claim before it)."""
_CLAIM = f"""
    UPDATE jobs SET claimed_by = ?, claimed_at = extract(epoch FROM clock_timestamp())
    FROM {_LAZY_COMMIT} WHERE seq = (SELECT seq FROM jobs WHERE {{which}}
                                     FOR UPDATE SKIP LOCKED)
    RETURNING {COLUMNS}
"""
"""``claimed_at`` is the clock when the row is written, just after the job was
locked: ``now()`` would be when the statement began, and a claim that began
first but was slower to take its job (a loaded machine, a lock wait) would be
stamped before one that took an earlier job ahead of it."""
_CLAIM_BEST = _CLAIM.format(which=f"seq = ({_BEST}) AND {_UNCLAIMED}")
"""Parameters: node, backends, prefer."""
_CLAIM_NEXT = _CLAIM.format(
    which=f"{_UNCLAIMED} AND backend = ANY(?) ORDER BY rank DESC, seq LIMIT 1"
)
"""Parameters: node, backends."""


def rank_of(priority: float, created_at: float, aging_rate: float) -> float:
    """A job's place in the one priority order (higher goes first): its
    effective priority at time 0, ``priority - aging_rate * created_at``."""
    return priority - aging_rate * created_at


class ClusterJobStore(JobStore):
    """The jobs of a cluster, as seen from one node.

    db: opened with :data:`yard.cluster.schema.MIGRATIONS`. node: this node's
    name (the origin of the jobs it takes in, the claimer in
    :meth:`mark_running`, and whose jobs :meth:`unfinished` returns).
    aging_rate: the scheduler's, for a new job's rank.
    """

    def __init__(self, db: PgDatabase, *, node: str, aging_rate: float = 0.0) -> None:
        super().__init__(db)
        self._pg = db
        self.node = node
        self._aging_rate = aging_rate

    @property
    def database(self) -> PgDatabase:
        return self._pg

    def _placed(self, priority: float, created_at: float) -> dict[str, object]:
        return {"rank": rank_of(priority, created_at, self._aging_rate), "origin": self.node}

    async def mark_running(self, job_id: str, *, at: float, queued_s: float) -> bool:
        """Queued -> running on this node, before its request goes upstream
        (after a requeue it is queued again first: :meth:`mark_requeued`).
        False if the job has ended (cancelled meanwhile), runs already, or
        another node holds it now.

        Stricter than one yard's, which lets a running job be marked running
        again: a node reaped while alive may claim a job back that it still
        holds in memory, and then holds it twice; only one of the two runs.
        """
        changed = await self._db.execute(
            "UPDATE jobs SET status = 'running', started_at = ?, queued_s = ?, "
            "claimed_by = ?, claimed_at = COALESCE(claimed_at, ?) "
            "WHERE id = ? AND status = 'queued' AND (claimed_by = ? OR claimed_by IS NULL)",
            (at, queued_s, self.node, at, job_id, self.node),
        )
        return changed == 1

    async def mark_requeued(self, job_id: str) -> bool:
        """Running here -> queued (still in this node's queue): the core put it
        back after a self-caused OOM. False if it is not running on this node
        (ended, or reaped and running on another node)."""
        return await self._requeue(job_id, " AND claimed_by = ?", self.node)

    async def end_run(
        self,
        job_id: str,
        status: Status,
        *,
        at: float,
        error: JobError | None = None,
        result: StoredResult | None = None,
    ) -> bool:
        """End a job this node ran, only while this node holds it: a very late
        end from a node declared dead (its jobs reaped: interrupted, or given
        back and perhaps running elsewhere now) ends nothing. A cancel, from
        any node, is :meth:`finish`."""
        return await self._finish(
            job_id, status, at, error, result, " AND claimed_by = ?", self.node
        )

    async def unfinished(self) -> list[JobRecord]:
        """The queued and running jobs this node holds, in arrival order: what
        a restart of this node puts back (:mod:`yard.jobs.restore`). Jobs in
        the shared queue are claimed, not restored."""
        return await self.claimed(self.node)

    # -- the shared queue ----------------------------------------------------

    async def claim(
        self, node: str, backends: Sequence[str], *, prefer: Sequence[str] = ()
    ) -> JobRecord | None:
        """Take the best unclaimed queued job of ``backends`` for ``node``:
        highest rank first, then (between equal ranks only) a backend of
        ``prefer`` (those loaded on ``node``), then arrival. Jobs another node
        is claiming this instant are skipped, not waited for. None if there
        is nothing to claim."""
        if not backends:
            return None
        wanted, preferred = list(backends), list(prefer)

        def _claim(tx: Tx) -> JobRecord | None:
            # Each statement is a transaction of its own (autocommit): the
            # usual claim is one round trip.
            row = tx.execute(_CLAIM_BEST, (node, wanted, preferred)).fetchone()
            if row is None and tx.execute(_BEST, (wanted, preferred)).fetchone() is not None:
                # The best is being claimed by another node this instant:
                # walk the one order past the jobs being claimed (without
                # the tie-break).
                row = tx.execute(_CLAIM_NEXT, (node, wanted)).fetchone()
            return None if row is None else job_record(row)

        return await self._pg.run(_claim)

    async def release(self, job_id: str, node: str) -> bool:
        """Give a job ``node`` claimed and has not started back to the shared
        queue, at its old place (same rank and seq), and wake the others.
        False if ``node`` does not hold it queued (any more)."""

        def _release(tx: Tx) -> bool:
            row = tx.execute(
                "UPDATE jobs SET claimed_by = NULL, claimed_at = NULL "
                "WHERE id = ? AND claimed_by = ? AND status = 'queued' RETURNING backend",
                (job_id, node),
            ).fetchone()
            if row is None:
                return False
            tx.notify(JOBS_CHANNEL, str(row[0]))
            return True

        return await self._db.transaction(_release)

    async def reap(self, node: str, *, now: float) -> ReapSummary:
        """Apply the restart rules to the jobs of ``node``, found dead (see
        the module rules): queued ones back to the shared queue at their old
        place; running ones interrupted, or back once if rerun-safe. Wakes the
        other nodes for the backends of the jobs it put back. Safe to call
        from several nodes at once: each job is moved by exactly one."""
        return await self._db.transaction(lambda tx: reap_node(tx, node, now))

    async def reap_gone(
        self, node: str, *, now: float, heartbeat_before: float | None
    ) -> ReapSummary | None:
        """Declare ``node`` gone in the registry and :meth:`reap` it, in one
        transaction; None if it was not up (another node declared it gone
        first and reaps it) or it published a heartbeat at or after
        ``heartbeat_before`` (it is alive).

        One transaction, because the other nodes leave a node's loaded
        backends alone only while it is up (its claimed jobs come back at
        their old place): if it read gone while its jobs were still claimed,
        they would claim the newer unclaimed jobs of those backends first.
        """

        def _reap_gone(tx: Tx) -> ReapSummary | None:
            declared = tx.execute(
                "UPDATE nodes SET state = 'gone' WHERE name = ? AND state = 'up' "
                "AND (?::double precision IS NULL OR heartbeat_at < ?)",
                (node, heartbeat_before, heartbeat_before),
            )
            return reap_node(tx, node, now) if declared.rowcount == 1 else None

        return await self._db.transaction(_reap_gone)

    async def waiting(self, backends: Sequence[str] | None = None) -> dict[str, int]:
        """How many unclaimed queued jobs each backend has (of ``backends``,
        or all); backends asked for with none waiting are given as 0."""
        query = f"SELECT backend, count(*) FROM jobs WHERE {_UNCLAIMED}"
        if backends is None:
            rows = await self._db.fetchall(f"{query} GROUP BY backend")
        else:
            rows = await self._db.fetchall(
                f"{query} AND backend = ANY(?) GROUP BY backend", (list(backends),)
            )
        found = {str(backend): int(n) for backend, n in rows}
        if backends is not None:
            return {backend: found.get(backend, 0) for backend in backends}
        return found

    async def claimed(self, node: str) -> list[JobRecord]:
        """The unfinished jobs ``node`` holds, in arrival order."""
        rows = await self._db.fetchall(
            f"SELECT {COLUMNS} FROM jobs WHERE claimed_by = ? "
            "AND status IN ('queued', 'running') ORDER BY seq",
            (node,),
        )
        return [job_record(row) for row in rows]


class SharedQueue:
    """The cluster's shared queue, as a node's job service puts jobs into it
    (a :class:`yard.jobs.service.JobQueue`): a stored job waits there,
    unclaimed, for the node that can start it soonest
    (:class:`yard.cluster.node.Node` claims it); its end may be written by
    any node, and is seen in the store.

    release: gives a job this node claimed back to the shared queue.
    recheck_s: how often a wait for a job's end reads the store again.
    """

    def __init__(
        self, release: Callable[[str], Awaitable[bool]], *, recheck_s: float = Jobs.RETRY_S
    ) -> None:
        self._release = release
        self.recheck_s = recheck_s
        self.wake: Callable[[], None] = lambda: None
        """Wakes this node's claims (set by :func:`yard.cluster.node.open_node`)."""

    def hand_in(self, jobs: Jobs, job: JobRecord) -> None:
        self.wake()

    def changed(self) -> None:
        self.wake()

    async def release(self, job_id: str) -> bool:
        return await self._release(job_id)
