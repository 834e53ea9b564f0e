"""The database interface every store is written against, and its SQLite side.

A store (jobs, batches, profiles, announcements) is one class over
:class:`Database`; what it runs on is injected: :class:`SqliteDatabase`
here (one yard, a file in ``data_dir``), or
:class:`yard.cluster.pg.PgDatabase` (the nodes of a cluster, one PostgreSQL).

Rules of the interface:

- SQL is written once, with ``?`` placeholders (never a ``?`` inside a
  literal); the PostgreSQL side turns them into its own. Both dialects
  understand what the stores use: ``RETURNING``, ``INSERT ... ON CONFLICT``
  (the upsert), ``count(*) FILTER (WHERE ...)``, ``true``/``false``, ``IN
  (?, ...)`` (:func:`marks`). What differs is a method of the transaction
  (:class:`Tx`): :meth:`Tx.notify` (PostgreSQL's ``NOTIFY``, nothing for one
  process), :meth:`Tx.lock` (an advisory lock; SQLite's ``BEGIN IMMEDIATE``
  already holds the one write lock) and :attr:`Tx.for_update`. Queries only
  a cluster runs (the claim, the registry) are the cluster's.
- Every call runs in a worker thread; the Trio loop never blocks on disk or
  network. A call that has started runs to the end even if its caller is
  cancelled: a write is wholly done or not begun.
- :meth:`Database.transaction` runs ``fn(tx)`` in one transaction, rolled
  back if ``fn`` raises. ``durable=True`` syncs that commit to the disk (a
  write promised to a client); PostgreSQL's commits always are.
- A lost server raises :class:`DatabaseLost`, a lock or time limit
  :class:`DatabaseBusy` (:func:`passing`: the same call may work later); any
  other :class:`DatabaseError` is the database refusing the call.

SQLite specifics: one connection behind a ``CapacityLimiter(1)``; WAL with
``synchronous=NORMAL``, so a crash of yard (even SIGKILL) loses nothing
committed, and ``durable=True`` commits with ``synchronous=FULL``.
Migrations are ``(name, sql_script)`` pairs, applied in order, each in its
own transaction together with its record in ``yard_migrations``; names
recorded by someone else are left alone, so several components may keep
their tables in one file (prefix names with the component: "jobs/1 ...").
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

Migration = tuple[str, str]
"""(name, SQL script) of SQLite. The name is recorded once the script has run."""

Row = tuple[Any, ...]
"""A row as the database returns it."""

T = TypeVar("T")

_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS yard_migrations (
    name TEXT PRIMARY KEY,
    applied_at REAL NOT NULL
)
"""


class DatabaseError(Exception):
    """The database cannot be used as asked (a failed migration, a closed
    connection, a refused statement). The message says what to do."""


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
    making again later; any other :class:`DatabaseError` is the database
    refusing the call, which it will do again."""
    return isinstance(exc, DatabaseLost | DatabaseBusy)


class Cursor(Protocol):
    """What a statement run in a transaction gives back."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Row | None: ...

    def fetchall(self) -> list[Row]: ...


class Tx(Protocol):
    """One transaction, inside :meth:`Database.transaction` (see the rules)."""

    for_update: str
    """`` FOR UPDATE`` where rows are locked one by one (PostgreSQL), else ``""``."""

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> int:
        """Run ``sql`` once per row; the rows they changed, in all."""
        ...

    def notify(self, channel: str, payload: str) -> None:
        """Tell the other processes on this database, once committed."""

    def lock(self, key: str) -> None:
        """Hold the lock named ``key`` until the transaction ends."""

    def insert_blob(
        self, table: str, values: Mapping[str, object], column: str, blob: bytes
    ) -> None:
        """``INSERT INTO table`` the ``values`` (text columns) and ``blob`` as
        ``column``, written so that no step holds the GIL, and with it the Trio loop, for
        the whole of a large ``blob`` (:data:`BLOB_PIECE` at a time where
        the database allows)."""


class Database(Protocol):
    """What a store needs of its database (see the module rules)."""

    async def execute(
        self, sql: str, params: Sequence[object] = (), *, durable: bool = False
    ) -> int:
        """Run one statement in its own transaction; the rows it changed."""
        ...

    async def fetchall(self, sql: str, params: Sequence[object] = ()) -> list[Row]: ...

    async def fetchone(self, sql: str, params: Sequence[object] = ()) -> Row | None: ...

    async def transaction(self, fn: Callable[[Tx], T], *, durable: bool = False) -> T: ...

    async def read_blob(
        self,
        table: str,
        column: str,
        key_column: str,
        key: object,
        *,
        start: int = 0,
        pieces: int | None = None,
    ) -> Blob | None:
        """Bytes of ``column`` in the row of ``table`` whose ``key_column``
        is ``key`` (None: no such row), from byte ``start`` on: at most
        ``pieces`` pieces of :data:`BLOB_PIECE` bytes (None: to the end),
        with the value's whole length, all read in one short transaction.
        Read a piece at a time, so that no step holds the GIL, and with it
        the Trio loop, for the whole of a large value; a value read a few
        pieces per call holds no transaction (nor, on SQLite, the read
        snapshot that keeps the WAL from being checkpointed) between calls."""
        ...

    async def close(self) -> None: ...


BLOB_PIECE = 1 << 20
"""The bytes of a large value read at once (:meth:`Database.read_blob`): for
a 55 MB value, 1 MiB pieces keep the Trio loop's longest wait near 5 ms where
one read of the whole value held it 55 ms."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Blob:
    """Part of a stored value, as :meth:`Database.read_blob` read it.

    length: the whole value's length in bytes.
    pieces: the bytes read, in pieces of :data:`BLOB_PIECE` (the last one
        shorter where the value ends); empty past the end.
    """

    length: int
    pieces: list[bytes]


def blob_pieces(length: int, start: int, pieces: int | None) -> range:
    """Where each piece of :meth:`Database.read_blob` starts, for a value of
    ``length`` bytes read from ``start`` on, at most ``pieces`` of them."""
    if start < 0 or (pieces is not None and pieces < 1):
        raise ValueError(f"read_blob: start {start} must be >= 0 and pieces {pieces} >= 1")
    end = length if pieces is None else min(length, start + pieces * BLOB_PIECE)
    return range(start, end, BLOB_PIECE)


def marks(n: int) -> str:
    """``n`` placeholders, for ``VALUES (...)`` and ``IN (...)``."""
    return ", ".join("?" * n)


def where_clause(conditions: Mapping[str, object]) -> tuple[str, list[object]]:
    """``WHERE`` and its parameters for those of ``conditions`` whose value is
    not None (``""`` and none if no value is). Each maps SQL with one ``?``
    to its value, or SQL with ``IN (...)`` (:func:`marks`) to a list of
    values; they are joined with ``AND``, in order."""
    params: list[object] = []
    for value in conditions.values():
        if isinstance(value, list):
            params.extend(value)
        elif value is not None:
            params.append(value)
    clauses = [sql for sql, value in conditions.items() if value is not None]
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params


def insert(
    tx: Tx, table: str, values: Mapping[str, object], *, conflict: str = "", returning: str = ""
) -> Cursor:
    """``INSERT INTO table`` the ``values`` (column: value), in ``tx``;
    ``ON CONFLICT conflict`` (the upsert) and ``RETURNING returning`` if given."""
    sql = f"INSERT INTO {table} ({', '.join(values)}) VALUES ({marks(len(values))})"
    sql += f" ON CONFLICT {conflict}" if conflict else ""
    sql += f" RETURNING {returning}" if returning else ""
    return tx.execute(sql, tuple(values.values()))


class _SqliteTx:
    for_update = ""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor:
        return self._conn.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> int:
        return self._conn.executemany(sql, rows).rowcount

    def notify(self, channel: str, payload: str) -> None:
        pass  # one process: nobody else listens

    def lock(self, key: str) -> None:
        pass  # BEGIN IMMEDIATE holds the one write lock already

    def insert_blob(
        self, table: str, values: Mapping[str, object], column: str, blob: bytes
    ) -> None:
        # A bound value is copied whole with the GIL held (55 MB: the loop
        # waited 54-75 ms); zeroblob() and the blob handle write it a piece
        # at a time, each write letting go of the GIL (4-8 ms).
        names = ", ".join([*values, column])
        cursor = self._conn.execute(
            f"INSERT INTO {table} ({names}) VALUES ({marks(len(values))}, zeroblob(?))",
            (*values.values(), len(blob)),
        )
        if not blob:
            return
        rowid = cursor.lastrowid
        assert rowid is not None
        view = memoryview(blob)
        with self._conn.blobopen(table, column, rowid) as handle:
            for start in range(0, len(blob), BLOB_PIECE):
                handle.write(view[start : start + BLOB_PIECE])


class SqliteDatabase:
    """One SQLite file, used from Trio. Open it with :meth:`open`; close it
    with :meth:`close` (idempotent)."""

    def __init__(
        self, path: Path, connection: sqlite3.Connection, *, threaded: bool = True
    ) -> None:
        # Use SqliteDatabase.open(): it also sets the pragmas and migrates.
        self._path = path
        self._conn: sqlite3.Connection | None = connection
        self._limiter = trio.CapacityLimiter(1)
        self._threaded = threaded
        # read_blob's own connection, opened on first use (see there).
        self._reader: sqlite3.Connection | None = None
        self._reader_limiter = trio.CapacityLimiter(1)

    @property
    def path(self) -> Path:
        """The file this database lives in."""
        return self._path

    @classmethod
    async def open(
        cls, path: Path, migrations: Sequence[Migration], *, threaded: bool = True
    ) -> SqliteDatabase:
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
        it changed (``cursor.rowcount``; -1 for statements that change none)."""
        return await self.transaction(lambda tx: tx.execute(sql, params).rowcount, durable=durable)

    async def fetchall(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        """Every row of a query."""
        return await self._run(lambda conn: [tuple(r) for r in conn.execute(sql, params)])

    async def fetchone(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        """The first row of a query, or None."""

        def _fetchone(conn: sqlite3.Connection) -> Row | None:
            row = conn.execute(sql, params).fetchone()
            return None if row is None else tuple(row)

        return await self._run(_fetchone)

    async def read_blob(
        self,
        table: str,
        column: str,
        key_column: str,
        key: object,
        *,
        start: int = 0,
        pieces: int | None = None,
    ) -> Blob | None:
        """See :meth:`Database.read_blob`. SQLite's incremental blob I/O reads
        only the pages of each piece and lets go of the GIL while it does;
        one open blob reads all the pieces of a call.

        On a connection of its own (read only, beside the one every other
        call shares): a download's reads neither wait for the other calls
        nor hold them up, and WAL lets it read while they write. That
        connection maps the file into memory (``mmap_size``): a blob opened
        at an offset walks the value's overflow pages from its start, one
        page read at a time; mapped, each step costs a pointer, not a copy.
        200 MB read 1 MiB per call took 3.8 s unmapped, 0.30 s mapped; 8 MiB
        per call 0.50 s and 0.06 s; one call for the whole 0.12 s and 0.10 s."""

        def _read(conn: sqlite3.Connection) -> Blob | None:
            row = conn.execute(
                f"SELECT rowid FROM {table} WHERE {key_column} = ?", (key,)
            ).fetchone()
            if row is None:
                return None
            with conn.blobopen(table, column, row[0], readonly=True) as blob:
                length = len(blob)
                starts = blob_pieces(length, start, pieces)
                if starts:
                    blob.seek(starts[0])
                return Blob(length=length, pieces=[blob.read(BLOB_PIECE) for _ in starts])

        async with self._reader_limiter:
            if self._conn is None:
                raise DatabaseError(f"{self._path}: the database is closed")
            reader = self._reader
            if reader is None:
                opening = functools.partial(_open_reader, self._path)
                reader = self._reader = await self._thread(opening)
            return await self._thread(functools.partial(_read, reader))

    async def transaction(self, fn: Callable[[Tx], T], *, durable: bool = False) -> T:
        """Run ``fn(tx)`` in a worker thread inside one transaction
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
                    result = fn(_SqliteTx(conn))
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
        # The reader first: the last connection to close checkpoints the WAL.
        async with self._reader_limiter:
            reader, self._reader = self._reader, None
            if reader is not None:
                await self._call(lambda c: c.close(), reader)
        async with self._limiter:
            conn, self._conn = self._conn, None
            if conn is not None:
                await self._call(lambda c: c.close(), conn)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        async with self._limiter:
            conn = self._conn
            if conn is None:
                raise DatabaseError(f"{self._path}: the database is closed")
            return await self._call(fn, conn)

    async def _call(self, fn: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
        return await self._thread(functools.partial(fn, conn))

    async def _thread(self, fn: Callable[[], T]) -> T:
        if not self._threaded:
            await trio.lowlevel.checkpoint()
            return fn()
        # Not abandoned on cancel: a statement that has begun finishes.
        return await trio.to_thread.run_sync(fn)


_READER_MMAP = 1 << 30
"""Bytes of the file that :meth:`SqliteDatabase.read_blob`'s connection maps
(address space, not memory: the pages are the OS's file cache)."""


def _open_reader(path: Path) -> sqlite3.Connection:
    """A second connection to the database at ``path``, for reads only."""
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA query_only = ON")
        conn.execute(f"PRAGMA mmap_size = {_READER_MMAP}")
    except BaseException:
        conn.close()
        raise
    return conn


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
