"""SQLite for Trio: one connection, one thread at a time, migrations by name.

Rules this module keeps:

- Every call runs in a worker thread (``trio.to_thread.run_sync``) behind a
  ``CapacityLimiter(1)``, so the one ``sqlite3`` connection is only ever used
  by one thread at a time and the Trio loop never blocks on disk. (aiosqlite
  is asyncio-only.)
- A call that has started in its thread runs to the end even if the caller is
  cancelled: a write is either wholly on disk or not begun, never abandoned
  halfway.
- The journal is WAL with ``synchronous=NORMAL``: a crash of yard (even
  SIGKILL) loses nothing committed. ``durable=True`` commits that one write
  with ``synchronous=FULL``, so it survives a power cut as well; callers use
  it before they promise something to a client (a 202 for a job).
- Migrations are ``(name, sql_script)`` pairs, applied in order, each in its
  own transaction together with its record in ``yard_migrations``. Several
  components may keep their tables in one file: names recorded by someone
  else are left alone, so prefix names with the component ("jobs/1 ...").
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import trio

Migration = tuple[str, str]
"""(name, SQL script). The name is recorded once the script has run."""

T = TypeVar("T")

_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS yard_migrations (
    name TEXT PRIMARY KEY,
    applied_at REAL NOT NULL
)
"""


class DatabaseError(Exception):
    """The database cannot be used as asked (a failed migration, a closed
    connection). The message names the file and what to do."""


class DatabaseLost(DatabaseError):
    """The PostgreSQL server could not be reached, or the connection broke
    during the call. Whether a write that raised this was committed is
    unknown; the next call reconnects."""


class DatabaseBusy(DatabaseError):
    """The call gave up on a lock or ran past the statement timeout, or the
    server rolled it back as a deadlock or serialization failure. Its
    transaction was rolled back; the same call may work later."""


def passing(exc: BaseException) -> bool:
    """Whether ``exc`` is a database error that may pass by itself
    (:class:`DatabaseLost`, :class:`DatabaseBusy`), so the same call is worth
    making again later; any other :class:`DatabaseError` is the server
    refusing the call, which it will do again."""
    return isinstance(exc, DatabaseLost | DatabaseBusy)


class Database:
    """One SQLite file, used from Trio.

    Open it with :meth:`open`; close it with :meth:`close` (idempotent).
    """

    def __init__(
        self, path: Path, connection: sqlite3.Connection, *, threaded: bool = True
    ) -> None:
        # Use Database.open(): it also sets the pragmas and migrates.
        self._path = path
        self._conn: sqlite3.Connection | None = connection
        self._limiter = trio.CapacityLimiter(1)
        self._threaded = threaded

    @property
    def path(self) -> Path:
        """The file this database lives in."""
        return self._path

    @classmethod
    async def open(
        cls, path: Path, migrations: Sequence[Migration], *, threaded: bool = True
    ) -> Database:
        """Open (creating it and its parent directory if needed) the database
        at ``path`` and apply every migration of ``migrations`` not yet
        recorded, in order.

        threaded: False runs every call in the Trio thread itself, blocking
        it. Only for tests on virtual time (``MockClock(autojump_threshold=0)``):
        while a task waits for a worker thread, the mock clock would jump.

        Raises :class:`DatabaseError` if a migration fails (that migration is
        rolled back; earlier ones stay) or if the file is not a database.
        """
        names = [name for name, _ in migrations]
        if len(set(names)) != len(names):
            raise DatabaseError(f"{path}: migration names must be unique, got {names}")

        def _open() -> sqlite3.Connection:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            try:
                conn.execute("PRAGMA busy_timeout = 10000")
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
                if mode is None or str(mode[0]).lower() != "wal":
                    raise DatabaseError(f"{path}: cannot switch the journal to WAL (got {mode})")
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("PRAGMA foreign_keys = ON")
                _migrate(conn, path, migrations)
            except sqlite3.DatabaseError as exc:
                conn.close()
                raise DatabaseError(f"{path}: {exc}") from exc
            except BaseException:
                conn.close()
                raise
            return conn

        if threaded:
            conn = await trio.to_thread.run_sync(_open)
        else:
            await trio.lowlevel.checkpoint()
            conn = _open()
        return cls(path, conn, threaded=threaded)

    async def execute(
        self, sql: str, params: Sequence[object] = (), *, durable: bool = False
    ) -> int:
        """Run one statement in its own transaction; return the number of rows
        it changed (``cursor.rowcount``; -1 for statements that change none).

        durable: commit with ``synchronous=FULL`` (the write survives a power
        cut once this returns).
        """

        def _execute(conn: sqlite3.Connection) -> int:
            return conn.execute(sql, params).rowcount

        return await self.transaction(_execute, durable=durable)

    async def fetchall(self, sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        """Every row of a query."""

        def _fetchall(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
            return [tuple(row) for row in conn.execute(sql, params).fetchall()]

        return await self._run(_fetchall)

    async def fetchone(self, sql: str, params: Sequence[object] = ()) -> tuple[object, ...] | None:
        """The first row of a query, or None."""

        def _fetchone(conn: sqlite3.Connection) -> tuple[object, ...] | None:
            row = conn.execute(sql, params).fetchone()
            return None if row is None else tuple(row)

        return await self._run(_fetchone)

    async def transaction(
        self, fn: Callable[[sqlite3.Connection], T], *, durable: bool = False
    ) -> T:
        """Run ``fn(connection)`` in a worker thread inside one transaction
        (``BEGIN IMMEDIATE`` ... ``COMMIT``) and return what it returns.

        If ``fn`` raises, the transaction is rolled back and the exception
        propagates. ``fn`` must not open or close transactions itself.
        durable: commit with ``synchronous=FULL``.
        """

        def _transaction(conn: sqlite3.Connection) -> T:
            if durable:
                conn.execute("PRAGMA synchronous = FULL")
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = fn(conn)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                return result
            finally:
                if durable:
                    conn.execute("PRAGMA synchronous = NORMAL")

        return await self._run(_transaction)

    async def close(self) -> None:
        """Close the connection (checkpointing the WAL). Idempotent; later
        calls of the other methods raise :class:`DatabaseError`."""

        def _close(conn: sqlite3.Connection) -> None:
            conn.close()

        async with self._limiter:
            conn, self._conn = self._conn, None
            if conn is not None:
                await self._call(_close, conn)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        async with self._limiter:
            conn = self._conn
            if conn is None:
                raise DatabaseError(f"{self._path}: the database is closed")
            return await self._call(fn, conn)

    async def _call(self, fn: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
        if not self._threaded:
            await trio.lowlevel.checkpoint()
            return fn(conn)
        # Not abandoned on cancel: a statement that has begun finishes.
        return await trio.to_thread.run_sync(fn, conn)


def _migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration]) -> None:
    conn.execute(_MIGRATIONS_TABLE)
    done = {str(row[0]) for row in conn.execute("SELECT name FROM yard_migrations")}
    for name, script in migrations:
        if name in done:
            continue
        # executescript would commit any open transaction first and then run
        # each statement on its own; wrapping the script and its record in
        # BEGIN/COMMIT keeps a migration all-or-nothing, even across a crash.
        # (A script takes no parameters, hence the quoted literal.)
        quoted = name.replace("'", "''")
        record = (
            f"INSERT INTO yard_migrations (name, applied_at) VALUES ('{quoted}', {time.time()!r})"
        )
        try:
            conn.executescript(f"BEGIN IMMEDIATE;\n{script}\n;{record};\nCOMMIT;")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise DatabaseError(
                f"{path}: migration {name!r} failed: {exc}; the file is left as it was "
                "before this migration"
            ) from exc
