"""The announcements table, in the jobs database (migrations by name, :mod:`yard.db`)."""

from __future__ import annotations

from yard.db import Migration

MIGRATIONS: tuple[Migration, ...] = (
    (
        "announcements/1 create announcements",
        """
        CREATE TABLE announcements (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            app TEXT NOT NULL,
            model TEXT NOT NULL,
            backend TEXT NOT NULL,
            not_before REAL NOT NULL,               -- epoch: the window opens
            start_by REAL NOT NULL,                 -- epoch: the window closes
            count INTEGER NOT NULL,
            used INTEGER NOT NULL DEFAULT 0,
            priority REAL NOT NULL,
            status TEXT NOT NULL,                   -- open, used, expired, withdrawn
            source TEXT NOT NULL DEFAULT 'api',     -- api, or config (recurring)
            created_at REAL NOT NULL,
            ended_at REAL
        );
        CREATE INDEX announcements_by_app ON announcements (app, seq);
        CREATE INDEX announcements_by_status ON announcements (status, start_by);
        """,
    ),
)
