"""PgDatabase against a real PostgreSQL: migrations, transactions, a lost server."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import trio

from yard.cluster.pg import DatabaseBusy, DatabaseLost, PgDatabase, PgLimits, PgMigration, passing
from yard.db import DatabaseError, Tx
from yard.testing.postgres import PostgresMissing, PostgresServer, find_bin_dir

MIGRATIONS = (
    PgMigration(version=1, name="a table", sql="CREATE TABLE things (n integer NOT NULL)"),
    PgMigration(
        version=2,
        name="a row written by the migration itself",
        sql="CREATE TABLE runs (at timestamptz); INSERT INTO runs VALUES (now())",
    ),
)


async def test_three_nodes_opening_at_once_migrate_exactly_once(postgres_dsn: str) -> None:
    opened: list[PgDatabase] = []

    async def open_one() -> None:
        opened.append(await PgDatabase.open(postgres_dsn, MIGRATIONS))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(open_one)
    try:
        db = opened[0]
        assert await db.fetchall("SELECT count(*) FROM runs") == [(1,)]
        rows = await db.fetchall("SELECT version, name FROM schema_migrations ORDER BY version")
        assert rows == [(1, "a table"), (2, "a row written by the migration itself")]
    finally:
        for db in opened:
            await db.close()


async def test_reopening_applies_only_the_new_migrations(postgres_dsn: str) -> None:
    with trio.fail_after(30):
        db = await PgDatabase.open(postgres_dsn, MIGRATIONS[:1])
        await db.close()
        db = await PgDatabase.open(postgres_dsn, MIGRATIONS)
        try:
            assert await db.fetchone("SELECT count(*) FROM runs") == (1,)
            assert await db.fetchone("SELECT count(*) FROM schema_migrations") == (2,)
        finally:
            await db.close()


async def test_a_failed_migration_leaves_the_earlier_ones(postgres_dsn: str) -> None:
    broken = (*MIGRATIONS, PgMigration(version=3, name="broken", sql="CREATE TABLE things ()"))
    with trio.fail_after(30):
        with pytest.raises(DatabaseError, match=r"migration 3 \(broken\) failed"):
            await PgDatabase.open(postgres_dsn, broken)
        db = await PgDatabase.open(postgres_dsn, MIGRATIONS)
        try:
            assert await db.fetchone("SELECT max(version) FROM schema_migrations") == (2,)
        finally:
            await db.close()


async def test_a_database_of_a_newer_yard_is_refused(postgres_dsn: str) -> None:
    with trio.fail_after(30):
        await (await PgDatabase.open(postgres_dsn, MIGRATIONS)).close()
        with pytest.raises(DatabaseError, match="newer than this yard knows"):
            await PgDatabase.open(postgres_dsn, MIGRATIONS[:1])


async def test_a_transaction_that_raises_is_rolled_back(postgres_dsn: str) -> None:
    def insert_then_fail(conn: Tx) -> None:
        conn.execute("INSERT INTO things VALUES (1)")
        raise LookupError("no")

    with trio.fail_after(30):
        db = await PgDatabase.open(postgres_dsn, MIGRATIONS)
        try:
            with pytest.raises(LookupError):
                await db.transaction(insert_then_fail)
            assert await db.execute("INSERT INTO things VALUES (?), (?)", (2, 3)) == 2
            assert await db.fetchall("SELECT n FROM things ORDER BY n") == [(2,), (3,)]
            with pytest.raises(DatabaseError, match="PostgreSQL: ") as refused:
                await db.execute("INSERT INTO things VALUES (NULL)")
            assert not passing(refused.value)  # refused, and would be again
            assert db.healthy
        finally:
            await db.close()
        with pytest.raises(DatabaseError, match="closed"):
            await db.fetchone("SELECT 1")


async def test_a_stopped_server_raises_database_lost_and_a_restart_heals(
    postgres_server: PostgresServer,
) -> None:
    name = postgres_server.create_database()
    try:
        with trio.fail_after(60):
            db = await PgDatabase.open(postgres_server.dsn(name), MIGRATIONS)
            try:
                await trio.to_thread.run_sync(postgres_server.stop)
                with pytest.raises(DatabaseLost, match="PostgreSQL"):
                    await db.fetchone("SELECT count(*) FROM things")
                assert not db.healthy
                with pytest.raises(DatabaseLost, match="cannot reach PostgreSQL"):
                    await db.fetchone("SELECT count(*) FROM things")
                await trio.to_thread.run_sync(postgres_server.start)
                assert await db.fetchone("SELECT count(*) FROM things") == (0,)
                assert db.healthy
                stats = db.statistics()
                assert (stats.healthy, stats.lost, stats.busy, stats.idle) == (True, 2, 0, 1)
            finally:
                await db.close()
    finally:
        postgres_server.drop_database(name)


def test_without_postgresql_the_tests_fail_and_say_to_run_make_postgresql(
    tmp_path: Path,
) -> None:
    with pytest.raises(PostgresMissing, match="run `make postgresql`"):
        find_bin_dir(tmp_path, search_path=str(tmp_path))
    (tmp_path / "9.6" / "bin").mkdir(parents=True)
    (tmp_path / "15" / "bin").mkdir(parents=True)
    for version in ("9.6", "15"):
        (tmp_path / version / "bin" / "initdb").touch()
    assert find_bin_dir(tmp_path, search_path="") == tmp_path / "15" / "bin"


async def test_a_lock_wait_that_times_out_is_an_error_not_a_lost_server(
    postgres_dsn: str,
) -> None:
    def wait_for_the_lock(conn: Tx) -> None:
        conn.execute("SET LOCAL lock_timeout = '100ms'")  # the session's is 10 s
        conn.execute("SELECT n FROM things FOR UPDATE")

    with trio.fail_after(30):
        db = await PgDatabase.open(postgres_dsn, MIGRATIONS)
        try:
            assert await db.fetchall(
                "SELECT current_setting('idle_in_transaction_session_timeout'), "
                "current_setting('lock_timeout'), current_setting('statement_timeout')"
            ) == [("15s", "10s", "1min")]
            await db.execute("INSERT INTO things VALUES (1)")
            # Another node's transaction holds the row (its host gone quiet).
            with psycopg.connect(postgres_dsn) as other:
                other.execute("SELECT n FROM things FOR UPDATE")
                with pytest.raises(DatabaseError, match="lock timeout") as caught:
                    await db.transaction(wait_for_the_lock)
                assert isinstance(caught.value, DatabaseBusy) and passing(caught.value)
                other.rollback()
            assert db.healthy and db.statistics().lost == 0
            assert await db.fetchone("SELECT count(*) FROM things") == (1,)
        finally:
            await db.close()


async def test_session_limits_are_set_on_every_connection_and_checked(postgres_dsn: str) -> None:
    limits = PgLimits(idle_in_transaction_s=2, lock_timeout_s=0.25, statement_timeout_s=90)
    with trio.fail_after(30):
        db = await PgDatabase.open(postgres_dsn, MIGRATIONS, limits=limits)
        try:
            assert await db.fetchone(
                "SELECT current_setting('idle_in_transaction_session_timeout'), "
                "current_setting('lock_timeout'), current_setting('statement_timeout')"
            ) == ("2s", "250ms", "90s")
        finally:
            await db.close()
    with pytest.raises(ValueError, match="lock_timeout_s must be a positive number"):
        PgLimits(lock_timeout_s=0)


async def test_a_server_restart_between_two_calls_costs_no_call(
    postgres_server: PostgresServer,
) -> None:
    name = postgres_server.create_database()
    try:
        with trio.fail_after(60):
            db = await PgDatabase.open(postgres_server.dsn(name), MIGRATIONS, connections=2)
            try:
                await db.execute("INSERT INTO things VALUES (1)")
                assert db.statistics().idle == 1
                await trio.to_thread.run_sync(postgres_server.stop)
                await trio.to_thread.run_sync(postgres_server.start)
                # The pooled connection died with the old server: a new one serves.
                assert await db.fetchone("SELECT count(*) FROM things") == (1,)
                assert db.statistics().lost == 0
            finally:
                await db.close()
    finally:
        postgres_server.drop_database(name)
