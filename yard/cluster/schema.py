"""The tables every node of a cluster shares, as versioned migrations.

- ``jobs``, ``job_requests``, ``job_results``: the columns of the SQLite job
  store (:data:`yard.jobs.store.MIGRATIONS`), plus what one shared queue needs:
  ``rank`` (the job's place in the one priority order: linear aging keeps it
  static, see :mod:`yard.cluster.jobs`), ``origin`` (the node that took it
  in), ``claimed_by`` / ``claimed_at`` (the node whose queue holds it now).
  ``jobs_queue`` orders every unclaimed queued job by rank (``claim`` walks
  it); ``jobs_waiting`` does the same per backend.
- ``nodes``: the registry (:mod:`yard.cluster.registry`), one row per node.
- ``profiles``, ``profile_history``: measured profiles
  (:mod:`yard.cluster.profiles`), keyed so that nodes with the same GPU
  model share them.

A migration once released is never edited: a change is a new version.
"""

from __future__ import annotations

from yard.cluster.pg import PgMigration

__all__ = ["ENDED_CHANNEL", "JOBS_CHANNEL", "MIGRATIONS", "NODES_CHANNEL"]

JOBS_CHANNEL = "yard_jobs"
"""NOTIFY channel: a job became claimable; the payload is its backend."""

ENDED_CHANNEL = "yard_job_ended"
"""NOTIFY channel: a job ended (finished, cancelled, interrupted by a reap);
the payload is its id. For the node running it (a cancel from elsewhere) and
for clients waiting on another node."""

NODES_CHANNEL = "yard_nodes"
"""NOTIFY channel: a node published its state; the payload is its name."""

MIGRATIONS: tuple[PgMigration, ...] = (
    PgMigration(
        version=1,
        name="jobs, their requests and results, with rank and claims",
        sql="""
        CREATE TABLE jobs (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- arrival order
            id text NOT NULL UNIQUE,
            app text NOT NULL,
            model text NOT NULL,
            backend text NOT NULL,
            priority double precision NOT NULL,
            start_by double precision,                -- epoch, or NULL
            not_before double precision,              -- epoch, or NULL
            allow_late boolean NOT NULL DEFAULT false,
            rerun_safe boolean NOT NULL DEFAULT false,
            rerun_used boolean NOT NULL DEFAULT false, -- put back once after a crash
            requeued boolean NOT NULL DEFAULT false,   -- put back once after a self-caused OOM
            status text NOT NULL CHECK (status IN
                ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'expired')),
            created_at double precision NOT NULL,
            started_at double precision,
            finished_at double precision,
            queued_s double precision,
            error_code text,
            error_message text,
            error_status integer,
            result_status integer,
            result_bytes bigint,
            result_type text,
            request_bytes bigint NOT NULL DEFAULT 0,
            rank double precision NOT NULL,           -- priority - aging_rate * created_at
            origin text NOT NULL,                     -- the node that took it in
            claimed_by text,                          -- the node whose queue holds it
            claimed_at double precision
        );
        CREATE INDEX jobs_by_app ON jobs (app, seq);
        CREATE INDEX jobs_by_status ON jobs (status, finished_at);
        CREATE INDEX jobs_waiting ON jobs (status, backend, rank DESC, seq)
            WHERE claimed_by IS NULL;
        -- The one order: claim() walks it from the top, skipping backends
        -- the node does not serve, and stops at the first job it can lock.
        CREATE INDEX jobs_queue ON jobs (rank DESC, seq)
            WHERE status = 'queued' AND claimed_by IS NULL;
        CREATE INDEX jobs_by_claim ON jobs (claimed_by, status) WHERE claimed_by IS NOT NULL;
        CREATE TABLE job_requests (
            job_id text PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
            method text NOT NULL,
            path text NOT NULL,
            query text NOT NULL,
            headers text NOT NULL,                    -- JSON [[name, value], ...] (latin-1)
            body bytea NOT NULL
        );
        CREATE TABLE job_results (
            job_id text PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
            status integer NOT NULL,
            headers text NOT NULL,
            body bytea NOT NULL
        );
        """,
    ),
    PgMigration(
        version=2,
        name="the node registry",
        sql="""
        CREATE TABLE nodes (
            name text PRIMARY KEY,
            url text NOT NULL,
            state text NOT NULL CHECK (state IN ('up', 'gone')),
            heartbeat_at double precision NOT NULL,   -- the node's wall clock
            started_at double precision NOT NULL,
            database_ok boolean NOT NULL,
            serves jsonb NOT NULL,                    -- model names
            backends jsonb NOT NULL,                  -- backend names
            loaded jsonb NOT NULL,                    -- backend names loaded now
            free_mib jsonb NOT NULL,                  -- {device: MiB}
            queues jsonb NOT NULL,                    -- {backend: waiting here}
            gpu_models jsonb NOT NULL
        );
        """,
    ),
    PgMigration(
        version=3,
        name="profiles shared by GPU model",
        sql="""
        CREATE TABLE profiles (
            key text PRIMARY KEY,
            backend text NOT NULL,
            parts jsonb NOT NULL,
            gpu_bytes bigint NOT NULL,
            host_bytes bigint NOT NULL,
            load_s double precision NOT NULL,
            steady_gpu_bytes bigint,
            steady_host_bytes bigint,
            source text NOT NULL,
            measured_at double precision NOT NULL,
            context integer,
            gpu_per_token double precision,
            host_per_token double precision,
            node text NOT NULL                        -- where it was measured
        );
        CREATE TABLE profile_history (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            key text NOT NULL,
            backend text NOT NULL,
            gpu_bytes bigint NOT NULL,
            host_bytes bigint NOT NULL,
            load_s double precision NOT NULL,
            steady_gpu_bytes bigint,
            steady_host_bytes bigint,
            source text NOT NULL,
            measured_at double precision NOT NULL,
            context integer,
            gpu_per_token double precision,
            host_per_token double precision,
            node text NOT NULL
        );
        CREATE INDEX profile_history_by_backend ON profile_history (backend, id);
        """,
    ),
)
