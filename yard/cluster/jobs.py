"""The jobs of a cluster in PostgreSQL: one shared queue in one priority order.

Rules this module keeps (beside those of :mod:`yard.jobs.store`, which it
mirrors method for method, so :class:`yard.jobs.service.Jobs` runs on either):

- **One order.** With linear aging a waiting job's effective priority is
  ``priority + aging_rate * (now - created_at)``; the part that differs
  between jobs, ``rank = priority - aging_rate * created_at``, never changes.
  So one index (``jobs_waiting``) orders every node's waiting jobs, and a job
  handed to node 1 with a higher rank is claimed before a lower one handed to
  node 2, whichever node claims.
- **Claims.** A job is inserted unclaimed, and ``NOTIFY yard_jobs, backend``
  goes out in the same transaction (so a listener never wakes before the row
  is visible). :meth:`PgJobStore.claim` takes the best unclaimed queued job
  of the given backends with ``FOR UPDATE SKIP LOCKED``: two nodes claiming
  at once never get the same job and never wait for each other. A claimed job
  stays ``queued`` in the claiming node's own queue until it runs.
- **A job ends exactly once, and runs on one node.** Every final move is a
  conditional update, as in SQLite. :meth:`PgJobStore.mark_running` also
  requires the job to be queued and claimed by this store's node (or by
  none, and then claims it): a node that was declared dead and reaped, but
  still holds the job in memory, finds it gone (or already running) instead
  of running it a second time.
- **Dead nodes.** :meth:`PgJobStore.reap` applies the rules of a restart to
  the jobs a dead node held (:mod:`yard.cluster.reaping`).
  :meth:`PgJobStore.reap_gone` declares the node gone in the same
  transaction, so no node sees it gone while it still holds jobs.
- **Ends are announced.** Every end (:meth:`PgJobStore.finish`, a reap's
  interruptions) sends ``NOTIFY yard_job_ended, job_id`` in its transaction:
  the node running a job cancelled elsewhere, and clients waiting on another
  node, hear it at once.
- **Quotas** are checked under a per-app advisory lock, so two nodes taking
  in jobs of one app at once cannot both squeeze past it.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from yard.cluster.pg import PgDatabase, Row
from yard.cluster.reaping import ReapSummary, reap_node
from yard.cluster.schema import ENDED_CHANNEL, JOBS_CHANNEL
from yard.jobs.records import (
    STATUSES,
    UNFINISHED,
    JobError,
    JobRecord,
    Quota,
    QuotaExceeded,
    Status,
    StoredRequest,
    StoredResult,
    Usage,
)
from yard.jobs.rows import COLUMNS, dump_headers, job_record, load_headers

__all__ = ["PgJobStore", "rank_of"]

_ENDED = "('succeeded', 'failed', 'cancelled')"
_UNCLAIMED = "status = 'queued' AND claimed_by IS NULL"
"""The jobs a claim may take (the rows of the ``jobs_queue`` index)."""
_BEST = f"""
    SELECT top.seq FROM unnest(%(backends)s::text[]) AS wanted (backend)
    CROSS JOIN LATERAL (
        SELECT seq, rank, backend FROM jobs
        WHERE {_UNCLAIMED} AND backend = wanted.backend
        ORDER BY rank DESC, seq LIMIT 1
    ) AS top
    ORDER BY top.rank DESC, top.backend = ANY(%(prefer)s) DESC, top.seq
    LIMIT 1
"""
"""The best unclaimed job of ``backends`` (a preferred backend first among
equal ranks), read without locking it."""
_LAZY_COMMIT = "(SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit"
"""Joined into a one-statement transaction, its commit does not wait for the
disk: for claims, whose loss in a crash of the database only gives the job
back to the shared queue (every later change of the job, such as
mark_running, is synced, and syncing it syncs the claim before it)."""
_CLAIM_BEST = f"""
    UPDATE jobs SET claimed_by = %(node)s, claimed_at = extract(epoch FROM now())
    FROM {_LAZY_COMMIT}
    WHERE seq = (SELECT seq FROM jobs WHERE seq = ({_BEST}) AND {_UNCLAIMED}
                 FOR UPDATE SKIP LOCKED)
    RETURNING {COLUMNS}
"""
_CLAIM_NEXT = f"""
    UPDATE jobs SET claimed_by = %(node)s, claimed_at = extract(epoch FROM now())
    FROM {_LAZY_COMMIT}
    WHERE seq = (SELECT seq FROM jobs WHERE {_UNCLAIMED} AND backend = ANY(%(backends)s)
                 ORDER BY rank DESC, seq LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING {COLUMNS}
"""


def rank_of(priority: float, created_at: float, aging_rate: float) -> float:
    """A job's place in the one priority order (higher goes first): its
    effective priority at time 0, ``priority - aging_rate * created_at``."""
    return priority - aging_rate * created_at


class PgJobStore:
    """The jobs of a cluster, as seen from one node.

    db: opened with :data:`yard.cluster.schema.MIGRATIONS`. node: this node's
    name (the origin of the jobs it takes in, the claimer in
    :meth:`mark_running`, and whose jobs :meth:`unfinished` returns).
    aging_rate: the scheduler's, to compute a job's rank when
    :meth:`insert` is not given one.
    """

    def __init__(self, db: PgDatabase, *, node: str, aging_rate: float = 0.0) -> None:
        self._db = db
        self._node = node
        self._aging_rate = aging_rate

    @property
    def node(self) -> str:
        return self._node

    @property
    def database(self) -> PgDatabase:
        return self._db

    async def close(self) -> None:
        await self._db.close()

    # -- writes --------------------------------------------------------------

    async def insert(
        self,
        *,
        job_id: str,
        app: str,
        model: str,
        backend: str,
        priority: float,
        start_by: float | None,
        allow_late: bool,
        rerun_safe: bool,
        created_at: float,
        request: StoredRequest,
        quota: Quota | None = None,
        not_before: float | None = None,
        rank: float | None = None,
        origin: str | None = None,
    ) -> JobRecord:
        """Record a new queued, unclaimed job and its request, and wake every
        listening node (``NOTIFY yard_jobs, backend``), in one transaction.

        rank: its place in the order (default :func:`rank_of` with this
        store's aging rate). origin: the node that took it in (default this
        one). quota: as in :meth:`yard.jobs.store.JobStore.insert`; raises
        :class:`QuotaExceeded` and stores nothing.
        """
        size = len(request.body)
        if rank is None:
            rank = rank_of(priority, created_at, self._aging_rate)

        def _insert(conn: psycopg.Connection[Row]) -> JobRecord:
            if quota is not None:
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"yard quota {app}",))
                usage = _usage(conn, app)
                if usage.jobs >= quota.max_jobs or usage.bytes + size > quota.max_bytes:
                    raise QuotaExceeded(usage, quota, size)
            row = conn.execute(
                "INSERT INTO jobs (id, app, model, backend, priority, start_by, allow_late, "
                "rerun_safe, status, created_at, request_bytes, not_before, rank, origin) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'queued', %s, %s, %s, %s, %s) "
                f"RETURNING {COLUMNS}",
                (
                    job_id,
                    app,
                    model,
                    backend,
                    priority,
                    start_by,
                    allow_late,
                    rerun_safe,
                    created_at,
                    size,
                    not_before,
                    rank,
                    origin or self._node,
                ),
            ).fetchone()
            assert row is not None
            conn.execute(
                "INSERT INTO job_requests (job_id, method, path, query, headers, body) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                (
                    job_id,
                    request.method,
                    request.path,
                    request.query,
                    dump_headers(request.headers),
                    request.body,
                ),
            )
            conn.execute("SELECT pg_notify(%s, %s)", (JOBS_CHANNEL, backend))
            return job_record(row)

        return await self._db.transaction(_insert)

    async def delete(self, job_id: str) -> None:
        """Forget a job entirely (one that was never accepted)."""
        await self._db.execute("DELETE FROM jobs WHERE id = %s", (job_id,))

    async def mark_running(self, job_id: str, *, at: float, queued_s: float) -> bool:
        """Queued -> running on this node, before its request goes upstream
        (after a requeue it is queued again first: :meth:`mark_requeued`).
        False if the job has ended (cancelled meanwhile), runs already, or
        another node holds it now.

        Stricter than SQLite, which lets a running job be marked running
        again: a node reaped while alive may claim a job back that it still
        holds in memory, and then holds it twice; only one of the two runs.
        """
        changed = await self._db.execute(
            "UPDATE jobs SET status = 'running', started_at = %s, queued_s = %s, "
            "claimed_by = %s, claimed_at = COALESCE(claimed_at, %s) "
            "WHERE id = %s AND status = 'queued' "
            "AND (claimed_by = %s OR claimed_by IS NULL)",
            (at, queued_s, self._node, at, job_id, self._node),
        )
        return changed == 1

    async def mark_requeue_spent(self, job_id: str) -> None:
        """Its one requeue after a self-caused OOM may be used now: never grant
        another (kept for good)."""
        await self._db.execute("UPDATE jobs SET requeued = true WHERE id = %s", (job_id,))

    async def mark_requeued(self, job_id: str) -> bool:
        """Running here -> queued (still in this node's queue): the core put it
        back after a self-caused OOM. False if it is not running on this node
        (ended, or reaped and running on another node)."""
        changed = await self._db.execute(
            "UPDATE jobs SET status = 'queued', requeued = true, started_at = NULL "
            "WHERE id = %s AND status = 'running' AND claimed_by = %s",
            (job_id, self._node),
        )
        return changed == 1

    async def mark_rerun(self, job_id: str) -> bool:
        """Running -> queued after a restart of this node, for a job the client
        marked rerun-safe; the one rerun is spent."""
        changed = await self._db.execute(
            "UPDATE jobs SET status = 'queued', rerun_used = true, started_at = NULL "
            "WHERE id = %s AND status = 'running' AND rerun_safe AND NOT rerun_used",
            (job_id,),
        )
        return changed == 1

    async def finish(
        self,
        job_id: str,
        status: Status,
        *,
        at: float,
        error: JobError | None = None,
        result: StoredResult | None = None,
    ) -> bool:
        """End an unfinished job with ``status`` (and its error or result).
        False if it had already ended: the first end wins, on any node."""
        if status in UNFINISHED:
            raise ValueError(f"finish() needs a final status, not {status!r}")

        def _finish(conn: psycopg.Connection[Row]) -> bool:
            cursor = conn.execute(
                "UPDATE jobs SET status = %s, finished_at = %s, error_code = %s, "
                "error_message = %s, error_status = %s, result_status = %s, "
                "result_bytes = %s, result_type = %s "
                "WHERE id = %s AND status IN ('queued', 'running')",
                (
                    status,
                    at,
                    None if error is None else error.code,
                    None if error is None else error.message,
                    None if error is None else error.status,
                    None if result is None else result.status,
                    None if result is None else len(result.body),
                    None if result is None else result.content_type,
                    job_id,
                ),
            )
            if cursor.rowcount != 1:
                return False
            conn.execute("SELECT pg_notify(%s, %s)", (ENDED_CHANNEL, job_id))
            # Its request will never run again: drop the bytes now.
            conn.execute("DELETE FROM job_requests WHERE job_id = %s", (job_id,))
            if result is not None:
                conn.execute(
                    "INSERT INTO job_results (job_id, status, headers, body) "
                    "VALUES (%s, %s, %s, %s)",
                    (job_id, result.status, dump_headers(result.headers), result.body),
                )
            return True

        return await self._db.transaction(_finish)

    async def expire(self, *, finished_before: float) -> list[str]:
        """Jobs that ended before ``finished_before`` become ``expired`` and
        their results are deleted. Returns their ids."""

        def _expire(conn: psycopg.Connection[Row]) -> list[str]:
            ids = [
                str(row[0])
                for row in conn.execute(
                    f"UPDATE jobs SET status = 'expired' WHERE status IN {_ENDED} "
                    "AND finished_at < %s RETURNING id",
                    (finished_before,),
                )
            ]
            conn.execute("DELETE FROM job_results WHERE job_id = ANY(%s)", (ids,))
            return ids

        return await self._db.transaction(_expire)

    async def forget_result(self, job_id: str) -> bool:
        """An ended job becomes ``expired`` now and its result is deleted.
        False if the job has not ended (or does not exist)."""

        def _forget(conn: psycopg.Connection[Row]) -> bool:
            cursor = conn.execute(
                "UPDATE jobs SET status = 'expired' WHERE id = %s AND status IN "
                "('succeeded', 'failed', 'cancelled', 'expired')",
                (job_id,),
            )
            conn.execute("DELETE FROM job_results WHERE job_id = %s", (job_id,))
            return cursor.rowcount == 1

        return await self._db.transaction(_forget)

    async def usage(self, app: str) -> Usage:
        """What ``app`` keeps stored now, over the whole cluster."""
        return await self._db.transaction(lambda conn: _usage(conn, app))

    async def purge(self, *, finished_before: float) -> int:
        """Forget expired jobs that ended before ``finished_before``."""
        return await self._db.execute(
            "DELETE FROM jobs WHERE status = 'expired' AND finished_at < %s", (finished_before,)
        )

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

        def _claim(conn: psycopg.Connection[Row]) -> JobRecord | None:
            # Each statement is a transaction of its own (autocommit): the
            # usual claim is one round trip.
            params = {"node": node, "backends": list(backends), "prefer": list(prefer)}
            row = conn.execute(_CLAIM_BEST, params).fetchone()
            if row is None and conn.execute(_BEST, params).fetchone() is not None:
                # The best is being claimed by another node this instant:
                # walk the one order past the jobs being claimed (without
                # the tie-break).
                row = conn.execute(_CLAIM_NEXT, params).fetchone()
            return None if row is None else job_record(row)

        return await self._db.run(_claim)

    async def release(self, job_id: str, node: str) -> bool:
        """Give a job ``node`` claimed and has not started back to the shared
        queue, at its old place (same rank and seq), and wake the others.
        False if ``node`` does not hold it queued (any more)."""

        def _release(conn: psycopg.Connection[Row]) -> bool:
            row = conn.execute(
                "UPDATE jobs SET claimed_by = NULL, claimed_at = NULL "
                "WHERE id = %s AND claimed_by = %s AND status = 'queued' RETURNING backend",
                (job_id, node),
            ).fetchone()
            if row is None:
                return False
            conn.execute("SELECT pg_notify(%s, %s)", (JOBS_CHANNEL, str(row[0])))
            return True

        return await self._db.transaction(_release)

    async def reap(self, node: str, *, now: float) -> ReapSummary:
        """Apply the restart rules to the jobs of ``node``, found dead (see
        the module rules): queued ones back to the shared queue at their old
        place; running ones interrupted, or back once if rerun-safe. Wakes the
        other nodes for the backends of the jobs it put back. Safe to call
        from several nodes at once: each job is moved by exactly one."""

        return await self._db.transaction(lambda conn: reap_node(conn, node, now))

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

        def _reap_gone(conn: psycopg.Connection[Row]) -> ReapSummary | None:
            declared = conn.execute(
                "UPDATE nodes SET state = 'gone' WHERE name = %s AND state = 'up' "
                "AND (%s::double precision IS NULL OR heartbeat_at < %s)",
                (node, heartbeat_before, heartbeat_before),
            )
            return reap_node(conn, node, now) if declared.rowcount == 1 else None

        return await self._db.transaction(_reap_gone)

    async def waiting(self, backends: Sequence[str] | None = None) -> dict[str, int]:
        """How many unclaimed queued jobs each backend has (of ``backends``,
        or all); backends asked for with none waiting are given as 0."""
        if backends is None:
            rows = await self._db.fetchall(
                "SELECT backend, count(*) FROM jobs WHERE status = 'queued' "
                "AND claimed_by IS NULL GROUP BY backend"
            )
        else:
            rows = await self._db.fetchall(
                "SELECT backend, count(*) FROM jobs WHERE status = 'queued' "
                "AND claimed_by IS NULL AND backend = ANY(%s) GROUP BY backend",
                (list(backends),),
            )
        found = {str(backend): int(n) for backend, n in rows}
        if backends is not None:
            return {backend: found.get(backend, 0) for backend in backends}
        return found

    async def claimed(self, node: str) -> list[JobRecord]:
        """The unfinished jobs ``node`` holds, in arrival order."""
        rows = await self._db.fetchall(
            f"SELECT {COLUMNS} FROM jobs WHERE claimed_by = %s "
            "AND status IN ('queued', 'running') ORDER BY seq",
            (node,),
        )
        return [job_record(row) for row in rows]

    # -- reads ---------------------------------------------------------------

    async def get(self, job_id: str) -> JobRecord | None:
        row = await self._db.fetchone(f"SELECT {COLUMNS} FROM jobs WHERE id = %s", (job_id,))
        return None if row is None else job_record(row)

    async def list_jobs(
        self,
        *,
        app: str | None,
        statuses: Sequence[Status] = (),
        limit: int = 20,
        before_seq: int | None = None,
    ) -> list[JobRecord]:
        """Jobs newest first, of the whole cluster: of ``app`` (None: every
        app), with one of ``statuses`` (empty: any), older than
        ``before_seq`` (a cursor)."""
        where: list[str] = []
        params: list[object] = []
        if app is not None:
            where.append("app = %s")
            params.append(app)
        if statuses:
            where.append("status = ANY(%s)")
            params.append(list(statuses))
        if before_seq is not None:
            where.append("seq < %s")
            params.append(before_seq)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self._db.fetchall(
            f"SELECT {COLUMNS} FROM jobs {clause} ORDER BY seq DESC LIMIT %s", (*params, limit)
        )
        return [job_record(row) for row in rows]

    async def unfinished(self) -> list[JobRecord]:
        """The queued and running jobs this node holds, in arrival order: what
        a restart of this node puts back (:mod:`yard.jobs.restore`). Jobs in
        the shared queue are claimed, not restored."""
        return await self.claimed(self._node)

    async def request(self, job_id: str) -> StoredRequest | None:
        row = await self._db.fetchone(
            "SELECT method, path, query, headers, body FROM job_requests WHERE job_id = %s",
            (job_id,),
        )
        if row is None:
            return None
        method, path, query, headers, body = row
        return StoredRequest(
            method=str(method),
            path=str(path),
            query=str(query),
            headers=load_headers(str(headers)),
            body=bytes(body),
        )

    async def result(self, job_id: str) -> StoredResult | None:
        row = await self._db.fetchone(
            "SELECT status, headers, body FROM job_results WHERE job_id = %s", (job_id,)
        )
        if row is None:
            return None
        status, headers, body = row
        return StoredResult(
            status=int(status), headers=load_headers(str(headers)), body=bytes(body)
        )

    async def counts(self) -> dict[str, int]:
        """How many jobs of the cluster are in each status."""
        rows = await self._db.fetchall("SELECT status, count(*) FROM jobs GROUP BY status")
        found = {str(status): int(n) for status, n in rows}
        return {status: found.get(status, 0) for status in STATUSES}


def _usage(conn: psycopg.Connection[Row], app: str) -> Usage:
    row = conn.execute(
        "SELECT count(*), "
        "COALESCE(SUM(CASE WHEN status IN ('queued', 'running') THEN request_bytes "
        "ELSE COALESCE(result_bytes, 0) END), 0), "
        "MIN(CASE WHEN status NOT IN ('queued', 'running') THEN finished_at END) "
        "FROM jobs WHERE app = %s AND status != 'expired'",
        (app,),
    ).fetchone()
    assert row is not None
    jobs, size, oldest = row
    oldest_at = None if oldest is None else float(oldest)
    return Usage(jobs=int(jobs), bytes=int(size), oldest_finished_at=oldest_at)
