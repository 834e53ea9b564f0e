"""The tables every node of a cluster shares, as versioned migrations.

- ``jobs``, ``job_requests``, ``job_results``: the columns of the SQLite job
  store (:data:`yard.jobs.schema.MIGRATIONS`), plus what one shared queue needs:
  ``rank`` (the job's place in the one priority order: linear aging keeps it
  static, see :mod:`yard.cluster.jobs`), ``origin`` (the node that took it
  in), ``claimed_by`` / ``claimed_at`` (the node whose queue holds it now).
  ``jobs_queue`` orders every unclaimed queued job by rank (``claim`` walks
  it); ``jobs_waiting`` does the same per backend.
- ``nodes``: the registry (:mod:`yard.cluster.registry`), one row per node.
- ``profiles``, ``profile_history``: measured profiles
  (:mod:`yard.cluster.profiles`), keyed so that nodes with the same GPU
  model share them; the columns of :data:`yard.memory.profiles.PROFILE_MIGRATIONS`
  (version 5 added the slot count and per-slot slopes).
- ``files``, ``file_contents``, ``batches``, ``batch_lines``: the Batch API
  (:mod:`yard.cluster.batches`), the columns of :data:`yard.jobs.batch_tables.MIGRATIONS`
  plus ``batches.driver``: the node that drives the batch's bookkeeping.
  ``file_contents.body`` is stored uncompressed (``STORAGE EXTERNAL``, version
  6; version 7 rewrote the files stored compressed before): a file is read a
  MiB at a time with ``substring`` (:meth:`yard.cluster.pg.PgDatabase.read_blob`),
  which fetches only the TOAST chunks of that MiB from an uncompressed value,
  but decompresses a compressed one from its start each time, so reading a
  file cost time quadratic in its size (a 200 MB JSONL file: 30 s, now 0.47 s:
  ``python -m bench.file_content --postgres --mb 200``).

A migration once released is never edited: a change is a new version.
"""

from __future__ import annotations

from yard.cluster.pg import PgMigration
from yard.jobs.schema import ENDED_CHANNEL, JOBS_CHANNEL

__all__ = ["ENDED_CHANNEL", "JOBS_CHANNEL", "MIGRATIONS", "NODES_CHANNEL"]

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
    PgMigration(
        version=4,
        name="the Batch API: files, batches and their lines, with the driving node",
        sql="""
        CREATE TABLE files (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            id text NOT NULL UNIQUE,
            app text NOT NULL,
            purpose text NOT NULL,                    -- batch, batch_output
            filename text NOT NULL,
            bytes bigint NOT NULL,
            created_at double precision NOT NULL
        );
        CREATE INDEX files_by_app ON files (app, seq);
        CREATE TABLE file_contents (
            file_id text PRIMARY KEY REFERENCES files (id) ON DELETE CASCADE,
            body bytea NOT NULL
        );
        CREATE TABLE batches (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            id text NOT NULL UNIQUE,
            app text NOT NULL,
            endpoint text NOT NULL,
            input_file_id text NOT NULL,
            completion_window text NOT NULL,
            metadata text,                            -- JSON object, or NULL
            priority double precision NOT NULL,
            rerun_safe boolean NOT NULL DEFAULT false,
            status text NOT NULL,
            created_at double precision NOT NULL,
            expires_at double precision NOT NULL,
            in_progress_at double precision,
            finalizing_at double precision,
            completed_at double precision,
            failed_at double precision,
            expired_at double precision,
            cancelling_at double precision,
            cancelled_at double precision,
            errors text,                              -- JSON [{code, message, param, line}]
            output_file_id text,
            error_file_id text,
            total integer NOT NULL DEFAULT 0,
            completed integer NOT NULL DEFAULT 0,
            failed integer NOT NULL DEFAULT 0,
            driver text                               -- the node driving it, while unended
        );
        CREATE INDEX batches_by_app ON batches (app, seq);
        CREATE INDEX batches_unended ON batches (seq)
            WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling');
        CREATE TABLE batch_lines (
            batch_id text NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
            idx integer NOT NULL,                     -- submission order (grouped by model)
            line integer NOT NULL,                    -- 1-based line of the input file
            custom_id text NOT NULL,
            model text NOT NULL,
            backend text NOT NULL,
            body bytea,                               -- until it becomes a job
            job_id text,                              -- once it is a job
            outcome text,                             -- ok | error | expired, once ended
            output text,                              -- its line of the output or error file
            PRIMARY KEY (batch_id, idx)
        );
        """,
    ),
    PgMigration(
        version=5,
        name="profiles: the slot count and per-slot slopes",
        sql="""
        ALTER TABLE profiles ADD COLUMN parallel integer;
        ALTER TABLE profiles ADD COLUMN gpu_per_slot double precision;
        ALTER TABLE profiles ADD COLUMN host_per_slot double precision;
        ALTER TABLE profile_history ADD COLUMN parallel integer;
        ALTER TABLE profile_history ADD COLUMN gpu_per_slot double precision;
        ALTER TABLE profile_history ADD COLUMN host_per_slot double precision;
        """,
    ),
    PgMigration(
        version=6,
        name="file contents stored uncompressed, so a piece is read without the ones before it",
        # Only the column's strategy: takes the table's exclusive lock for a
        # moment; the rewrite is version 7, so that the lock is not held
        # while it runs. Values stored from now on are not compressed,
        # whichever yard version stores them.
        sql="ALTER TABLE file_contents ALTER COLUMN body SET STORAGE EXTERNAL;",
    ),
    PgMigration(
        version=7,
        name="file contents stored compressed before version 6 rewritten uncompressed",
        # A compressed value is smaller than its bytes (an uncompressed
        # one, inline or not, is not): that selects exactly the compressed
        # ones. `body || ''` is a new value, decompressed once and stored by
        # the column's strategy now; the bytes are the same. Row locks only.
        sql="""
        UPDATE file_contents SET body = body || ''::bytea
            WHERE pg_column_size(body) < octet_length(body);
        """,
    ),
)
