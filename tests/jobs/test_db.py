"""yard.db: SQLite used from Trio, with migrations by name."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
import trio

from yard.db import BLOB_PIECE, Blob, DatabaseError, SqliteDatabase, Tx

CREATE = ("t/1 create", "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL);")
ADD_COLUMN = ("t/2 add size", "ALTER TABLE items ADD COLUMN size INTEGER NOT NULL DEFAULT 0;")


async def test_open_creates_the_file_in_wal_mode_and_applies_migrations(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "x.sqlite"
    db = await SqliteDatabase.open(path, [CREATE])
    try:
        assert path.exists()
        assert await db.fetchone("PRAGMA journal_mode") == ("wal",)
        assert await db.execute("INSERT INTO items (name) VALUES (?)", ("a",)) == 1
        assert await db.fetchall("SELECT id, name FROM items") == [(1, "a")]
    finally:
        await db.close()


async def test_reopening_applies_only_the_new_migrations_and_keeps_rows(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite"
    db = await SqliteDatabase.open(path, [CREATE])
    await db.execute("INSERT INTO items (name) VALUES ('kept')", durable=True)
    await db.close()

    db = await SqliteDatabase.open(path, [CREATE, ADD_COLUMN])
    try:
        assert await db.fetchall("SELECT name, size FROM items") == [("kept", 0)]
        names = await db.fetchall("SELECT name FROM yard_migrations ORDER BY name")
        assert names == [("t/1 create",), ("t/2 add size",)]
    finally:
        await db.close()


async def test_components_sharing_a_file_leave_each_others_migrations_alone(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.sqlite"
    await (await SqliteDatabase.open(path, [CREATE])).close()
    other = ("o/1 create", "CREATE TABLE others (k TEXT PRIMARY KEY);")
    db = await SqliteDatabase.open(path, [other])
    try:
        assert await db.fetchall("SELECT count(*) FROM items") == [(0,)]
        assert await db.fetchall("SELECT count(*) FROM others") == [(0,)]
    finally:
        await db.close()


async def test_a_failing_migration_is_rolled_back_whole_and_named(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite"
    broken = ("t/2 broken", "CREATE TABLE half (a INTEGER); INSERT INTO nowhere VALUES (1);")
    with pytest.raises(DatabaseError, match="t/2 broken"):
        await SqliteDatabase.open(path, [CREATE, broken])
    conn = sqlite3.connect(path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        applied = [r[0] for r in conn.execute("SELECT name FROM yard_migrations")]
    finally:
        conn.close()
    assert "items" in tables
    assert "half" not in tables
    assert applied == ["t/1 create"]


async def test_a_failing_transaction_changes_nothing(tmp_path: Path) -> None:
    db = await SqliteDatabase.open(tmp_path / "x.sqlite", [CREATE])

    def two_inserts_then_fail(conn: Tx) -> None:
        conn.execute("INSERT INTO items (name) VALUES ('one')")
        conn.execute("INSERT INTO items (name) VALUES (NULL)")  # NOT NULL fails

    try:
        with pytest.raises(sqlite3.IntegrityError):
            await db.transaction(two_inserts_then_fail, durable=True)
        assert await db.fetchall("SELECT name FROM items") == []
        # The connection is usable afterwards, back on the normal sync level.
        await db.execute("INSERT INTO items (name) VALUES ('two')")
        assert await db.fetchone("PRAGMA synchronous") == (1,)  # NORMAL
    finally:
        await db.close()


async def test_durable_write_runs_with_synchronous_full(tmp_path: Path) -> None:
    db = await SqliteDatabase.open(tmp_path / "x.sqlite", [CREATE])

    def level(conn: Tx) -> object:
        return conn.execute("PRAGMA synchronous").fetchall()[0][0]

    try:
        assert await db.transaction(level, durable=True) == 2  # FULL
        assert await db.transaction(level) == 1  # NORMAL
    finally:
        await db.close()


async def test_concurrent_callers_are_serialised_on_one_connection(tmp_path: Path) -> None:
    db = await SqliteDatabase.open(tmp_path / "x.sqlite", [CREATE])
    try:
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(db.execute, "INSERT INTO items (name) VALUES (?)", (f"n{i}",))
        assert await db.fetchone("SELECT count(*) FROM items") == (20,)
    finally:
        await db.close()


async def test_calls_after_close_raise_a_clear_error(tmp_path: Path) -> None:
    db = await SqliteDatabase.open(tmp_path / "x.sqlite", [CREATE])
    await db.close()
    await db.close()
    with pytest.raises(DatabaseError, match="closed"):
        await db.fetchall("SELECT 1")
    with pytest.raises(DatabaseError, match="closed"):
        await db.read_blob("blobs", "body", "id", "a")


BLOBS = ("t/1 blobs", "CREATE TABLE blobs (id TEXT PRIMARY KEY, body BLOB NOT NULL);")


async def test_read_blob_reads_the_pieces_asked_for_and_the_whole_length(tmp_path: Path) -> None:
    value = bytes(range(256)) * (3 * BLOB_PIECE // 256) + b"tail"
    db = await SqliteDatabase.open(tmp_path / "x.sqlite", [BLOBS])
    try:
        await db.execute("INSERT INTO blobs VALUES ('a', ?), ('e', x'')", (value,))
        whole = await db.read_blob("blobs", "body", "id", "a")
        assert whole is not None and whole.length == len(value)
        assert [len(p) for p in whole.pieces] == [BLOB_PIECE] * 3 + [4]
        part = await db.read_blob("blobs", "body", "id", "a", start=BLOB_PIECE + 1, pieces=2)
        assert part == Blob(
            length=len(value),
            pieces=[
                value[BLOB_PIECE + 1 : 2 * BLOB_PIECE + 1],
                value[2 * BLOB_PIECE + 1 : 3 * BLOB_PIECE + 1],
            ],
        )
        past = await db.read_blob("blobs", "body", "id", "a", start=len(value), pieces=1)
        assert past == Blob(length=len(value), pieces=[])
        assert await db.read_blob("blobs", "body", "id", "e") == Blob(length=0, pieces=[])
        assert await db.read_blob("blobs", "body", "id", "none") is None
        with pytest.raises(ValueError, match="pieces 0"):
            await db.read_blob("blobs", "body", "id", "a", pieces=0)
    finally:
        await db.close()


async def test_read_blob_does_not_wait_for_a_transaction_in_progress(tmp_path: Path) -> None:
    # Its own connection: a download's reads go on while a write holds the
    # one every other call shares (and see only what was committed).
    db = await SqliteDatabase.open(tmp_path / "x.sqlite", [BLOBS])
    try:
        await db.execute("INSERT INTO blobs VALUES ('a', x'0102')")
        in_write, release = trio.Event(), threading.Event()
        token = trio.lowlevel.current_trio_token()

        def slow_write(tx: Tx) -> None:
            tx.execute("UPDATE blobs SET body = x'03' WHERE id = 'a'")
            trio.from_thread.run_sync(in_write.set, trio_token=token)
            release.wait(10)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(db.transaction, slow_write)
            await in_write.wait()
            with trio.fail_after(5):
                read = await db.read_blob("blobs", "body", "id", "a")
            release.set()
        assert read == Blob(length=2, pieces=[b"\x01\x02"])
        assert await db.read_blob("blobs", "body", "id", "a") == Blob(length=1, pieces=[b"\x03"])
    finally:
        await db.close()
