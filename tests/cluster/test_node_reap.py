"""A dead node is declared gone and reaped in one step, on a real PostgreSQL
(two real :class:`yard.cluster.node.Node` loops with fake engines and job
services beside it).

The other nodes leave a node's loaded backends alone while it is up, so that
its claimed jobs come back at their old place before anyone claims newer
ones. If a node could be seen gone while it still held its jobs, the others
would claim the newer unclaimed jobs of its backends first (issue 13: a dead
node's queued jobs are served by the others in their old order).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from collections.abc import Set as AbstractSet
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import psycopg
import trio

from tests.cluster.test_node_rules import FakeListener, llm_engine
from yard.cluster.forward import Forwarder
from yard.cluster.jobs import ClusterJobStore
from yard.cluster.listen import Listener
from yard.cluster.node import Node
from yard.cluster.pg import PgDatabase
from yard.cluster.registry import NodeState, Registry
from yard.cluster.schema import MIGRATIONS
from yard.config import BackendConfig, Config, ServerConfig
from yard.config.cluster import ClusterConfig
from yard.core.spec import SchedulerConfig
from yard.jobs.records import JobRecord, StoredRequest

HEARTBEAT_S = 0.1
DEAD_AFTER_S = 10.0  # only c's heartbeat goes stale, and only when the test says
REQUEST = StoredRequest(
    method="POST", path="/v1/chat/completions", query="", headers=(), body=b"{}"
)


class FakeJobs:
    """The job service's side the node calls: claimed jobs, in order."""

    def __init__(self) -> None:
        self.enqueued: list[str] = []

    def enqueue(self, job: JobRecord, *, arrived_at_wall: float | None = None) -> None:
        self.enqueued.append(job.id)

    async def ended_elsewhere(self, job_ids: AbstractSet[str] | None) -> None:
        return None


@asynccontextmanager
async def running_node(dsn: str, name: str) -> AsyncIterator[FakeJobs]:
    """Node ``name`` with ``llm`` stopped (it would load it for a job),
    claiming from the real shared queue in ``dsn``."""
    config = Config(
        path=Path("/nonexistent/yard.toml"),
        server=ServerConfig(),
        scheduler=SchedulerConfig(),
        devices={},
        apps={},
        backends={"llm": BackendConfig(name="llm", models=("tiny",), command=("true",))},
    )
    cluster = ClusterConfig(
        database=dsn, node=name, heartbeat_s=HEARTBEAT_S, dead_after_s=DEAD_AFTER_S
    )
    db = await PgDatabase.open(dsn, MIGRATIONS)
    jobs = FakeJobs()
    listener = FakeListener()  # nothing announced: it looks at each heartbeat
    node = Node(
        config=config,
        cluster=cluster,
        engine=llm_engine("stopped"),
        jobs=jobs,
        store=ClusterJobStore(db, node=name),
        registry=Registry(db),
        listen=lambda: cast(Listener, listener),
        forwarder=Forwarder(node=name, secret=None, pool=cast(Any, None)),
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            yield jobs
            nursery.cancel_scope.cancel()
    finally:
        await db.close()


def _state(conn: psycopg.Connection[Any], ids: list[str]) -> tuple[str, list[object]]:
    """Node c's state in the registry and who holds each of ``ids``, as any
    other node reads them now."""
    row = conn.execute("SELECT state FROM nodes WHERE name = 'c'").fetchone()
    assert row is not None
    held = dict(conn.execute("SELECT id, claimed_by FROM jobs WHERE id = ANY(%s)", (ids,)))
    return str(row[0]), [held[i] for i in ids]


def _lock_waits(conn: psycopg.Connection[Any]) -> int:
    """Sessions of this database waiting for a lock now."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'"
    ).fetchone()
    assert row is not None
    return int(row[0])


async def _until(done: Callable[[], bool]) -> None:
    """Until ``done()``; the caller bounds the wait."""
    while True:
        if done():
            return
        await trio.sleep(0.01)


async def _publish_c(registry: Registry, heartbeat_at: float) -> None:
    """Node c, with llm loaded, as it published itself at ``heartbeat_at``."""
    await registry.publish(
        NodeState(
            name="c",
            url="http://c:1",
            heartbeat_at=heartbeat_at,
            started_at=heartbeat_at - 60.0,
            serves=("tiny",),
            backends=("llm",),
            loaded=("llm",),
        )
    )


async def test_a_dead_node_is_never_seen_gone_while_it_still_holds_its_jobs(
    postgres_dsn: str,
) -> None:
    db = await PgDatabase.open(postgres_dsn, MIGRATIONS)
    try:
        c = ClusterJobStore(db, node="c")
        registry = Registry(db)
        now = time.time()
        await _publish_c(registry, now)
        ids = [f"job-{i}" for i in range(4)]
        for i, job_id in enumerate(ids):
            await c.insert(
                job_id=job_id,
                app="app",
                model="tiny",
                backend="llm",
                priority=50.0,
                start_by=None,
                allow_late=False,
                rerun_safe=False,
                created_at=now - 50.0 + i,
                request=REQUEST,
            )
        # c holds the two oldest jobs; the two newer wait unclaimed.
        for job_id in ids[:2]:
            claimed = await c.claim("c", ["llm"])
            assert claimed is not None and claimed.id == job_id
        with (
            psycopg.connect(postgres_dsn, autocommit=True) as holder,
            psycopg.connect(postgres_dsn, autocommit=True) as observer,
        ):
            # A lock on one of c's jobs will hold whichever node reaps c half-way.
            holder.execute("BEGIN")
            holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (ids[0],))
            with trio.fail_after(30):
                await _publish_c(registry, time.time())
                async with (
                    running_node(postgres_dsn, "a") as a,
                    running_node(postgres_dsn, "b") as b,
                ):
                    # c is up with llm loaded: a and b leave llm's jobs to it.
                    await trio.sleep(3 * HEARTBEAT_S)
                    assert a.enqueued == b.enqueued == []
                    # c dies: its last heartbeat a minute old.
                    await _publish_c(registry, time.time() - 60.0)
                    await _until(lambda: _lock_waits(observer) > 0)
                    # The reap waits: every node still sees c up, holding its
                    # jobs, and a and b claim nothing of llm meanwhile.
                    for _ in range(5):
                        assert _state(observer, ids) == ("up", ["c", "c", None, None])
                        await trio.sleep(HEARTBEAT_S)
                    assert a.enqueued == b.enqueued == []
                    holder.execute("COMMIT")
                    await _until(lambda: len(a.enqueued) + len(b.enqueued) == len(ids))
            assert _state(observer, ids)[0] == "gone"
            # c's jobs came back at their old place: claimed first.
            claimed_at = {
                str(job_id): float(at)
                for job_id, at in observer.execute(
                    "SELECT id, claimed_at FROM jobs WHERE id = ANY(%s)", (ids,)
                )
            }
            assert max(claimed_at[i] for i in ids[:2]) <= min(claimed_at[i] for i in ids[2:])
    finally:
        await db.close()
