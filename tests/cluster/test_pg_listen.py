"""Listener against a real PostgreSQL: NOTIFY wakes it at once, it never
polls, and it comes back by itself after the server restarts."""

from __future__ import annotations

import socket

import pytest
import trio

from yard.cluster.jobs import ClusterJobStore
from yard.cluster.listen import Listener
from yard.cluster.pg import PgDatabase
from yard.cluster.registry import NodeState, Registry
from yard.cluster.schema import ENDED_CHANNEL, JOBS_CHANNEL, MIGRATIONS, NODES_CHANNEL
from yard.jobs.records import JobError, StoredRequest
from yard.testing.postgres import PostgresServer

REQUEST = StoredRequest(method="POST", path="/v1/audio/speech", query="", headers=(), body=b"{}")


async def hand_in(store: ClusterJobStore, job_id: str) -> None:
    await store.insert(
        job_id=job_id,
        app="radio",
        model="voice",
        backend="tts",
        priority=0.0,
        start_by=None,
        allow_late=False,
        rerun_safe=False,
        created_at=1.0,
        request=REQUEST,
    )


class StepCounter(trio.abc.Instrument):
    """Counts task steps: a task that polls takes steps while nothing happens."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


async def test_an_insert_on_another_connection_wakes_a_waiting_listener(
    postgres_dsn: str,
) -> None:
    db = await PgDatabase.open(postgres_dsn, MIGRATIONS)
    store = ClusterJobStore(db, node="n1")
    try:
        with trio.fail_after(10):
            async with Listener(postgres_dsn) as listener:
                assert listener.connected
                assert await listener.wait(0.05) == frozenset()
                async with trio.open_nursery() as nursery:
                    woke: list[tuple[float, frozenset[str]]] = []

                    async def waiter() -> None:
                        fired = await listener.wait()
                        woke.append((trio.current_time(), fired))

                    nursery.start_soon(waiter)
                    await trio.sleep(0.05)
                    sent_at = trio.current_time()
                    await hand_in(store, "a")
                assert woke[0][1] == {JOBS_CHANNEL}
                assert woke[0][0] - sent_at < 1.0
                node = NodeState(name="n1", url="http://n1", heartbeat_at=1.0, started_at=0.0)
                await Registry(db).publish(node)
                assert await listener.wait() == {NODES_CHANNEL}
                assert listener.statistics().notifications == 2
    finally:
        await store.close()


async def test_a_waiting_listener_does_not_poll(postgres_dsn: str) -> None:
    counter = StepCounter()
    with trio.fail_after(10):
        async with Listener(postgres_dsn) as listener:
            trio.lowlevel.add_instrument(counter)
            try:
                assert await listener.wait(0.5) == frozenset()
            finally:
                trio.lowlevel.remove_instrument(counter)
    # The waiting task wakes once at its deadline; the listener's own task
    # not at all. A poll every 50 ms would be 10 more.
    assert counter.steps <= 4, counter.steps


async def test_a_cancelled_wait_loses_nothing(postgres_dsn: str) -> None:
    db = await PgDatabase.open(postgres_dsn, MIGRATIONS)
    store = ClusterJobStore(db, node="n1")
    try:
        with trio.fail_after(10):
            async with Listener(postgres_dsn, channels=(JOBS_CHANNEL,)) as listener:
                await hand_in(store, "a")
                with trio.CancelScope() as scope:
                    scope.cancel()
                    await listener.wait()
                assert await listener.wait() == {JOBS_CHANNEL}
    finally:
        await store.close()


async def test_the_listener_reconnects_after_the_server_restarts(
    postgres_server: PostgresServer,
) -> None:
    name = postgres_server.create_database()
    dsn = postgres_server.dsn(name)
    try:
        with trio.fail_after(60):
            async with Listener(dsn, channels=(JOBS_CHANNEL,)) as listener:
                await trio.to_thread.run_sync(postgres_server.stop)
                await trio.to_thread.run_sync(postgres_server.start)
                # Whatever was sent meanwhile is lost: it says "look again".
                assert await listener.wait() == {JOBS_CHANNEL}
                assert listener.payloads(JOBS_CHANNEL) is None
                assert listener.connected
                assert listener.statistics().connects == 2
                db = await PgDatabase.open(dsn, MIGRATIONS)
                store = ClusterJobStore(db, node="n1")
                try:
                    await hand_in(store, "after")
                    assert await listener.wait() == {JOBS_CHANNEL}
                    assert listener.payloads(JOBS_CHANNEL) == frozenset({"tts"})
                finally:
                    await store.close()
    finally:
        postgres_server.drop_database(name)


async def test_the_end_of_a_job_is_heard_with_its_id(postgres_dsn: str) -> None:
    db = await PgDatabase.open(postgres_dsn, MIGRATIONS)
    one, two = ClusterJobStore(db, node="n1"), ClusterJobStore(db, node="n2")
    cancelled = JobError(code="cancelled", message="the job was cancelled", status=499)
    try:
        with trio.fail_after(10):
            async with Listener(postgres_dsn, channels=(ENDED_CHANNEL,)) as listener:
                for job_id in ("a", "b", "c", "d"):
                    await hand_in(one, job_id)
                assert await listener.wait(0.05) == frozenset()
                assert await one.mark_running("a", at=2.0, queued_s=1.0)
                # Cancelled on another node while it runs here.
                assert await two.finish("a", "cancelled", at=3.0, error=cancelled)
                assert not await one.finish("a", "failed", at=3.0)  # no second end, no word
                assert await listener.wait() == {ENDED_CHANNEL}
                assert listener.payloads(ENDED_CHANNEL) == frozenset({"a"})
                assert listener.payloads(ENDED_CHANNEL) == frozenset()
                # A reap's interruptions are ends too; its releases are not.
                await one.claim("n1", ("tts",))
                await one.claim("n1", ("tts",))
                assert await one.mark_running("b", at=2.0, queued_s=1.0)
                summary = await two.reap("n1", now=4.0)
                assert (summary.interrupted, summary.released) == (("b",), ("c",))
                assert await listener.wait() == {ENDED_CHANNEL}
                assert listener.payloads(ENDED_CHANNEL) == frozenset({"b"})
    finally:
        await db.close()


async def test_a_listener_on_a_server_that_is_down_opens_and_keeps_trying(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    with trio.fail_after(10):
        async with Listener(f"postgresql://postgres@127.0.0.1:{port}/none") as listener:
            assert not listener.connected
            assert await listener.wait(0.4) == frozenset()
            assert listener.statistics().connects == 0
    # Several attempts (50, 100, 200 ms apart), one warning for the outage.
    warnings = [r for r in caplog.records if "not listening" in r.getMessage()]
    assert len(warnings) == 1, warnings
