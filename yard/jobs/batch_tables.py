"""The Batch API's tables, migrated with the job database (see
:data:`yard.jobs.schema.MIGRATIONS`).

Why the job database and not files in ``data_dir``: a batch line becomes a
job in the same transaction that marks the line submitted, so no crash can
leave a line submitted twice or not at all; and WAL with a synced commit
already gives uploads the durability the jobs have. Uploads are blobs of at
most ``[jobs] batch_max_file_bytes``.
"""

from __future__ import annotations

MIGRATIONS: tuple[tuple[str, str], ...] = (
    (
        "batches/1 create files, batches and batch lines",
        """
        CREATE TABLE files (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            app TEXT NOT NULL,
            purpose TEXT NOT NULL,               -- batch, batch_output
            filename TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE INDEX files_by_app ON files (app, seq);
        CREATE TABLE file_contents (
            file_id TEXT PRIMARY KEY REFERENCES files (id) ON DELETE CASCADE,
            body BLOB NOT NULL
        );
        CREATE TABLE batches (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            app TEXT NOT NULL,
            endpoint TEXT NOT NULL,
            input_file_id TEXT NOT NULL,
            completion_window TEXT NOT NULL,
            metadata TEXT,                       -- JSON object, or NULL
            priority REAL NOT NULL,              -- the app's default at creation
            rerun_safe INTEGER NOT NULL DEFAULT 0,
            status TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,            -- created_at + the window: the finish-by
            in_progress_at REAL,
            finalizing_at REAL,
            completed_at REAL,
            failed_at REAL,
            expired_at REAL,
            cancelling_at REAL,
            cancelled_at REAL,
            errors TEXT,                         -- JSON [{code, message, param, line}]
            output_file_id TEXT,
            error_file_id TEXT,
            total INTEGER NOT NULL DEFAULT 0,
            completed INTEGER NOT NULL DEFAULT 0,
            failed INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX batches_by_app ON batches (app, seq);
        CREATE INDEX batches_by_status ON batches (status);
        CREATE TABLE batch_lines (
            batch_id TEXT NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,                -- submission order (grouped by model)
            line INTEGER NOT NULL,               -- 1-based line of the input file
            custom_id TEXT NOT NULL,
            model TEXT NOT NULL,
            backend TEXT NOT NULL,
            body BLOB,                           -- until it becomes a job
            job_id TEXT,                         -- once it is a job
            outcome TEXT,                        -- ok | error, once it has ended
            output TEXT,                         -- its line of the output or error file
            PRIMARY KEY (batch_id, idx)
        );
        """,
    ),
)
