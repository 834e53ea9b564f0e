"""The job database's tables (``data_dir/jobs.sqlite``), as migrations by
name (:mod:`yard.db`).

- ``jobs``: one row per job, in arrival order (``seq``); what
  :class:`~yard.jobs.records.JobRecord` holds (:mod:`yard.jobs.rows` reads a
  row into one), plus the bytes the per-app quota counts.
- ``job_requests``, ``job_results``: a job's request and result bytes, in
  their own tables so that listing and reading jobs never touches the blobs;
  both go when the job ends or expires.
- The Batch API's tables (:data:`yard.jobs.batch_tables.MIGRATIONS`) and the
  announcements (:data:`yard.jobs.announce_tables.MIGRATIONS`) live in this file
  too, migrated in the same order: a batch line becomes a job in the same
  transaction, and announcements are kept with the jobs they announce.

A migration once released is never edited: a change is a new migration. A
cluster's shared queue (:mod:`yard.cluster.schema`) has the same columns.
"""

from __future__ import annotations

from yard.db import Migration
from yard.jobs.announce_tables import MIGRATIONS as ANNOUNCE_MIGRATIONS
from yard.jobs.batch_tables import MIGRATIONS as BATCH_MIGRATIONS

__all__ = ["ENDED_CHANNEL", "JOBS_CHANNEL", "MIGRATIONS"]

JOBS_CHANNEL = "yard_jobs"
"""Where a new claimable job is announced (PostgreSQL's NOTIFY; nobody
listens to one yard's SQLite); the payload is its backend."""

ENDED_CHANNEL = "yard_job_ended"
"""Where a job's end is announced (finished, cancelled, interrupted by a
reap); the payload is its id. For the node running it (a cancel from
elsewhere) and for clients waiting on another node."""

MIGRATIONS: tuple[Migration, ...] = (
    (
        "jobs/1 create jobs, requests and results",
        """
        CREATE TABLE jobs (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- arrival order, never reused
            id TEXT NOT NULL UNIQUE,
            app TEXT NOT NULL,
            model TEXT NOT NULL,
            backend TEXT NOT NULL,
            priority REAL NOT NULL,
            start_by REAL,                          -- epoch, or NULL
            allow_late INTEGER NOT NULL DEFAULT 0,
            rerun_safe INTEGER NOT NULL DEFAULT 0,
            rerun_used INTEGER NOT NULL DEFAULT 0,  -- put back once after a restart
            requeued INTEGER NOT NULL DEFAULT 0,    -- put back once after a self-caused OOM
            status TEXT NOT NULL,
            created_at REAL NOT NULL,
            started_at REAL,
            finished_at REAL,
            queued_s REAL,
            error_code TEXT,
            error_message TEXT,
            error_status INTEGER,
            result_status INTEGER,
            result_bytes INTEGER,
            result_type TEXT
        );
        CREATE INDEX jobs_by_app ON jobs (app, seq);
        CREATE INDEX jobs_by_status ON jobs (status, finished_at);
        CREATE TABLE job_requests (
            job_id TEXT PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
            method TEXT NOT NULL,
            path TEXT NOT NULL,
            query TEXT NOT NULL,
            headers TEXT NOT NULL,                  -- JSON [[name, value], ...] (latin-1)
            body BLOB NOT NULL
        );
        CREATE TABLE job_results (
            job_id TEXT PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
            status INTEGER NOT NULL,
            headers TEXT NOT NULL,
            body BLOB NOT NULL
        );
        """,
    ),
    (
        "jobs/2 request bytes kept on the job, for the per-app quota",
        """
        ALTER TABLE jobs ADD COLUMN request_bytes INTEGER NOT NULL DEFAULT 0;
        UPDATE jobs SET request_bytes =
            COALESCE((SELECT length(body) FROM job_requests WHERE job_id = jobs.id), 0);
        """,
    ),
    # The Batch API's files, batches and lines (yard.batches) live in this
    # file too: a line becomes a job in the same transaction.
    *BATCH_MIGRATIONS,
    (
        "jobs/3 a time window's opening kept on the job (X-Yard-Not-Before)",
        "ALTER TABLE jobs ADD COLUMN not_before REAL;  -- epoch, or NULL",
    ),
    # Announcements (yard.announce) are kept with the jobs they announce.
    *ANNOUNCE_MIGRATIONS,
)
