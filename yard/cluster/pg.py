"""PostgreSQL for Trio: the cluster's side of :class:`yard.db.Database`.

Rules this module keeps (beside those of the interface, :mod:`yard.db`):

- Every call runs in a worker thread on one connection taken from a small
  fixed set. The stores' ``?`` placeholders become psycopg's ``%s``.
- A lost server (refused, reset, shut down, unreachable) raises
  :class:`DatabaseLost`, and the connection it broke is dropped; the next
  call connects afresh. Sessions are bounded (:class:`PgLimits`): a
  lock held by a node whose host vanished mid-transaction is freed by the
  server, and a call that waits too long on a lock fails instead of
  stalling its node (:class:`DatabaseBusy`, as are a statement timeout, a
  deadlock and a serialization failure: nothing was written, and the same
  call may work later). :attr:`PgDatabase.healthy` says whether the last call
  reached the server. Other SQL errors raise :class:`yard.db.DatabaseError`:
  the server refused the call, and will refuse it again.
- Migrations are versioned ``(version, name, sql)`` triples, applied in
  order, each in its own transaction with its row in ``schema_migrations``,
  under ``pg_advisory_xact_lock``: several nodes starting at once apply each
  one exactly once. A database migrated by a newer yard (a version this one
  does not know) is refused with a message saying so.
"""

from __future__ import annotations

import functools
import math
import select
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import psycopg
import trio

from yard.db import (
    BLOB_PIECE,
    Blob,
    Cursor,
    DatabaseBusy,
    DatabaseError,
    DatabaseLost,
    Row,
    Tx,
    blob_pieces,
    passing,
)

__all__ = [
    "DatabaseBusy",
    "DatabaseLost",
    "PgDatabase",
    "PgLimits",
    "PgMigration",
    "PgStatistics",
    "connect",
    "passing",
]

T = TypeVar("T")


@functools.lru_cache(maxsize=1024)
def _dialect(sql: str) -> str:
    # psycopg takes %s for a parameter and %% for a literal %.
    return sql.replace("%", "%%").replace("?", "%s")


def _statement(sql: str, params: Sequence[object]) -> tuple[str, Sequence[object] | None]:
    # Without parameters psycopg reads no placeholders (and no %%).
    return (_dialect(sql), params) if params else (sql, None)


_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
"""The start of COPY's binary format (then flags and header extension: 0, 0)."""


class _PgTx:
    for_update = " FOR UPDATE"

    def __init__(self, conn: psycopg.Connection[Row]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor:
        return self.conn.execute(*_statement(sql, params))

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> int:
        with self.conn.cursor() as cur:
            cur.executemany(_dialect(sql), rows)
            return max(0, cur.rowcount)

    def notify(self, channel: str, payload: str) -> None:
        self.conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))

    def lock(self, key: str) -> None:
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))

    def insert_blob(
        self, table: str, values: Mapping[str, object], column: str, blob: bytes
    ) -> None:
        # A bound value goes into libpq's buffer whole with the GIL held (55
        # MB: the loop waited ~60 ms, text or binary). COPY's binary format
        # takes the row as a stream: its head, then the value a piece at a
        # time, each piece one copy of BLOB_PIECE.
        names = ", ".join([*values, column])
        # The other columns' binary form: text's is its UTF-8.
        assert all(isinstance(value, str) for value in values.values()), values
        fields = [str(value).encode() for value in values.values()]
        head = bytearray(_COPY_SIGNATURE + struct.pack("!iih", 0, 0, len(fields) + 1))
        for field in fields:
            head += struct.pack("!i", len(field)) + field
        head += struct.pack("!i", len(blob))
        view = memoryview(blob)
        with (
            self.conn.cursor() as cursor,
            cursor.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            copy.write(head)
            for start in range(0, len(blob), BLOB_PIECE):
                copy.write(view[start : start + BLOB_PIECE])
            copy.write(struct.pack("!h", -1))


@dataclass(frozen=True, slots=True, kw_only=True)
class PgLimits:
    """How long yard's PostgreSQL sessions may wait, set on every connection
    it opens (migrations lift the lock and statement limits).

    connect_timeout_s: longest wait to reach the server (libpq rounds it up
        to whole seconds, at least 2).
    idle_in_transaction_s: the server ends a session of ours that sits in a
        transaction this long: a node whose host vanished mid-transaction
        must not keep its row locks (its claims, a reap) until the server's
        keepalives give up, hours later.
    lock_timeout_s: a call that waits longer for a lock fails
        (:class:`yard.db.DatabaseError`) instead of stalling its node.
    statement_timeout_s: the longest one statement may run.
    """

    connect_timeout_s: float = 5.0
    idle_in_transaction_s: float = 15.0
    lock_timeout_s: float = 10.0
    statement_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name in (
            "connect_timeout_s",
            "idle_in_transaction_s",
            "lock_timeout_s",
            "statement_timeout_s",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < math.inf):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")

    def settings(self) -> tuple[str, ...]:
        """The ``SET`` statements of a new session."""
        return (
            f"SET idle_in_transaction_session_timeout = {_ms(self.idle_in_transaction_s)}",
            f"SET lock_timeout = {_ms(self.lock_timeout_s)}",
            f"SET statement_timeout = {_ms(self.statement_timeout_s)}",
        )


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


_MIGRATION_LOCK = 0x79617264  # "yard": the advisory lock key of migrations


@dataclass(frozen=True, slots=True, kw_only=True)
class PgMigration:
    """One schema change. version: its place in the order (unique,
    increasing). name: what it does, for people. sql: the statements (no
    parameters), run in one transaction."""

    version: int
    name: str
    sql: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PgStatistics:
    """How a :class:`PgDatabase` is doing. healthy: the last call reached the
    server. calls: calls made. lost: calls that raised :class:`DatabaseLost`.
    busy: calls running now. idle: open connections waiting for a call."""

    healthy: bool
    calls: int
    lost: int
    busy: int
    idle: int


def connect(
    dsn: str, *, application_name: str = "yard", limits: PgLimits | None = None
) -> psycopg.Connection[Row]:
    """A blocking autocommit connection to ``dsn`` (for a worker thread), with
    a connect timeout, TCP keepalives and a TCP user timeout, so that a server
    that vanished without closing the connection is noticed in about 15 s, not
    after the kernel's hours; and with ``limits`` set on the session. Raises
    :class:`DatabaseLost`."""
    limits = limits or PgLimits()
    try:
        conn = psycopg.connect(
            dsn,
            autocommit=True,
            connect_timeout=max(2, math.ceil(limits.connect_timeout_s)),
            application_name=application_name,
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
            # Unacknowledged writes to a host that vanished give up too.
            tcp_user_timeout=15_000,
        )
    except psycopg.Error as exc:
        raise DatabaseLost(f"cannot reach PostgreSQL ({_where(dsn)}): {_first_line(exc)}") from exc
    try:
        for setting in limits.settings():
            conn.execute(setting)
    except psycopg.Error as exc:
        conn.close()
        raise DatabaseLost(f"cannot set up a PostgreSQL session: {_first_line(exc)}") from exc
    return conn


def _where(dsn: str) -> str:
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "the configured database"
    return f"host {info.get('host', 'localhost')}, database {info.get('dbname', '?')}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class PgDatabase:
    """One PostgreSQL database, used from Trio. Open it with :meth:`open`;
    close it with :meth:`close` (idempotent)."""

    def __init__(
        self,
        dsn: str,
        *,
        connections: int = 4,
        application_name: str = "yard",
        limits: PgLimits | None = None,
    ) -> None:
        # Use PgDatabase.open(): it also migrates.
        if connections < 1:
            raise ValueError("connections must be at least 1")
        self._dsn = dsn
        self._application_name = application_name
        self._limits = limits or PgLimits()
        self._limiter = trio.CapacityLimiter(connections)
        self._idle: list[psycopg.Connection[Row]] = []
        self._closed = False
        self._calls = 0
        self._lost = 0
        self.healthy = True
        """Whether the last call reached the server (False after a
        :class:`DatabaseLost`, True again after the next call that works)."""

    @property
    def dsn(self) -> str:
        return self._dsn

    def statistics(self) -> PgStatistics:
        return PgStatistics(
            healthy=self.healthy,
            calls=self._calls,
            lost=self._lost,
            busy=self._limiter.borrowed_tokens,
            idle=len(self._idle),
        )

    @classmethod
    async def open(
        cls,
        dsn: str,
        migrations: Sequence[PgMigration],
        *,
        connections: int = 4,
        application_name: str = "yard",
        limits: PgLimits | None = None,
    ) -> PgDatabase:
        """Connect to ``dsn`` and apply every migration of ``migrations`` not
        yet recorded (see the module rules).

        connections: how many calls may run at once (one connection each).
        limits: the sessions' time limits (default :class:`PgLimits`).
        Raises :class:`DatabaseLost` if the server cannot be reached and
        :class:`DatabaseError` if a migration fails (it is rolled back;
        earlier ones stay) or the database is newer than ``migrations``.
        """
        versions = [m.version for m in migrations]
        if versions != sorted(set(versions)):
            raise DatabaseError(f"migration versions must be unique and increasing: {versions}")
        db = cls(dsn, connections=connections, application_name=application_name, limits=limits)
        try:
            await db._call(lambda conn: _migrate(conn, migrations))
        except BaseException:
            await db.close()
            raise
        return db

    async def execute(
        self, sql: str, params: Sequence[object] = (), *, durable: bool = False
    ) -> int:
        """Run one statement in its own transaction; return the number of
        rows it changed (``rowcount``; -1 for statements that change none).
        Every commit is synced: ``durable`` changes nothing here."""
        return await self._call(lambda conn: conn.execute(*_statement(sql, params)).rowcount)

    async def fetchall(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        """Every row of a query."""
        return await self._call(lambda conn: conn.execute(*_statement(sql, params)).fetchall())

    async def fetchone(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        """The first row of a query, or None."""
        return await self._call(lambda conn: conn.execute(*_statement(sql, params)).fetchone())

    async def run(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn(tx)`` in a worker thread without a transaction around it:
        each statement it executes commits on its own (one round trip each).
        For a sequence of independent statements, each atomic by itself;
        psycopg's errors as in :meth:`transaction`."""
        return await self._call(lambda conn: fn(_PgTx(conn)))

    async def transaction(self, fn: Callable[[Tx], T], *, durable: bool = False) -> T:
        """Run ``fn(tx)`` in a worker thread inside one transaction and
        return what it returns; if ``fn`` raises, the transaction is rolled
        back and the exception propagates (psycopg's own errors as
        :class:`DatabaseError` or :class:`DatabaseLost`). ``fn`` must not
        open or close transactions itself."""

        def _transaction(conn: psycopg.Connection[Row]) -> T:
            with conn.transaction():
                return fn(_PgTx(conn))

        return await self._call(_transaction)

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
        """See :meth:`yard.db.Database.read_blob`: one ``substring`` a piece,
        in one repeatable-read transaction, each piece fetched in binary (a
        copy, where the text form of a whole value is hex decoded at once,
        holding the GIL).

        The column must be stored uncompressed (``SET STORAGE EXTERNAL``):
        then a ``substring`` fetches only the TOAST chunks of its piece,
        wherever it starts. Of a compressed value it decompresses everything
        before the piece too, and the whole read takes time quadratic in the
        value's size (200 MB of JSONL: 30 s instead of 0.47 s)."""
        where = f"FROM {table} WHERE {key_column} = %s"

        def _read(conn: psycopg.Connection[Row]) -> Blob | None:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                row = conn.execute(f"SELECT octet_length({column}) {where}", (key,)).fetchone()
                if row is None:
                    return None
                length = int(row[0])
                read: list[bytes] = []
                for at in blob_pieces(length, start, pieces):
                    piece = conn.execute(
                        f"SELECT substring({column} FROM %s FOR %s) {where}",
                        (at + 1, BLOB_PIECE, key),
                        binary=True,
                    ).fetchone()
                    assert piece is not None  # the snapshot still holds the row
                    read.append(bytes(piece[0]))
                return Blob(length=length, pieces=read)

        return await self._call(_read)

    async def close(self) -> None:
        """Close every connection. Idempotent; later calls raise
        :class:`DatabaseError`."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await trio.to_thread.run_sync(conn.close)

    async def _call(self, fn: Callable[[psycopg.Connection[Row]], T]) -> T:
        async with self._limiter:
            if self._closed:
                raise DatabaseError("the PostgreSQL database is closed")
            # The thread puts the connection it used here if it is fit for
            # reuse, whatever the outcome of fn.
            held: list[psycopg.Connection[Row]] = [self._idle.pop()] if self._idle else []
            self._calls += 1
            try:
                # Not abandoned on cancel: a transaction that has begun finishes.
                result = await trio.to_thread.run_sync(self._in_thread, held, fn)
            except DatabaseLost:
                self.healthy = False
                self._lost += 1
                raise
            finally:
                for conn in held:
                    if self._closed:
                        conn.close()
                    else:
                        self._idle.append(conn)
            self.healthy = True
            return result

    def _in_thread(
        self, held: list[psycopg.Connection[Row]], fn: Callable[[psycopg.Connection[Row]], T]
    ) -> T:
        conn = held.pop() if held else None
        if conn is not None and not _still_open(conn):
            conn = None
        if conn is None:
            conn = connect(self._dsn, application_name=self._application_name, limits=self._limits)
        try:
            result = fn(conn)
        except psycopg.Error as exc:
            if _lost(conn, exc):
                conn.close()
                raise DatabaseLost(
                    f"lost PostgreSQL ({_where(self._dsn)}): {_first_line(exc)}"
                ) from exc
            _keep(conn, held)
            if isinstance(exc, _BUSY):
                raise DatabaseBusy(f"PostgreSQL: {_first_line(exc)}") from exc
            raise DatabaseError(f"PostgreSQL: {_first_line(exc)}") from exc
        except BaseException:
            # fn's own error (or a bug): its transaction was rolled back.
            _keep(conn, held)
            raise
        held.append(conn)
        return result


def _still_open(conn: psycopg.Connection[Row]) -> bool:
    """Whether an idle connection is still usable, without a round trip. An
    idle session has nothing to read; a server that restarted or ended the
    session has sent its last words and closed the socket, so a readable
    socket means a stale connection (rarely, a harmless notice: then it costs
    one reconnect). A stale connection is closed, so that a call after a
    restart goes to a fresh one instead of failing as a lost database."""
    if not conn.closed and not conn.broken and not _readable(conn.pgconn.socket):
        return True
    conn.close()
    return False


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # pragma: no cover - no poll()


def _keep(conn: psycopg.Connection[Row], held: list[psycopg.Connection[Row]]) -> None:
    # Back to the pool only if it is idle and outside any transaction.
    if conn.broken or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.close()
    else:
        held.append(conn)


_BUSY = (
    psycopg.errors.QueryCanceled,  # statement_timeout
    psycopg.errors.LockNotAvailable,  # lock_timeout
    psycopg.errors.TransactionRollback,  # deadlock, serialization failure
)


def _lost(conn: psycopg.Connection[Row], exc: psycopg.Error) -> bool:
    """Whether ``exc`` means the connection (or the server) is gone, rather
    than that this one statement failed."""
    if conn.broken or conn.closed or conn.pgconn.status != psycopg.pq.ConnStatus.OK:
        return True
    return isinstance(exc, psycopg.OperationalError) and not isinstance(exc, _BUSY)


def _migrate(conn: psycopg.Connection[Row], migrations: Sequence[PgMigration]) -> None:
    known = {m.version for m in migrations}
    newest = max(known, default=0)
    while True:
        with conn.transaction():
            # A migration may take long, and so may the wait for another
            # node's.
            conn.execute("SET LOCAL lock_timeout = 0")
            conn.execute("SET LOCAL statement_timeout = 0")
            # Held until this transaction ends: a second node starting now
            # waits here, then finds the migration recorded.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                "version integer PRIMARY KEY, name text NOT NULL, "
                "applied_at double precision NOT NULL)"
            )
            done = {int(row[0]) for row in conn.execute("SELECT version FROM schema_migrations")}
            unknown = sorted(done - known)
            if unknown and unknown[-1] > newest:
                raise DatabaseError(
                    f"the database schema is at version {unknown[-1]}, newer than this yard "
                    f"knows ({newest}): another node runs a newer yard; upgrade this one"
                )
            todo = [m for m in migrations if m.version not in done]
            if not todo:
                return
            migration = todo[0]
            try:
                conn.execute(migration.sql)
            except psycopg.Error as exc:
                raise DatabaseError(
                    f"migration {migration.version} ({migration.name}) failed: "
                    f"{_first_line(exc)}; the database is left as it was before it"
                ) from exc
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
                (migration.version, migration.name, time.time()),
            )
