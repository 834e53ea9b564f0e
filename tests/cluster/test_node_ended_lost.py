"""A node hears that jobs ended (``NOTIFY yard_job_ended``) just as the
shared database goes away: looking them up fails, and the node must live on
(a lost database is a state it serves through, not a crash), say the
database is lost, and look at every job again once it is back.

Virtual time, with the fakes of ``test_node_rules.py``.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import trio
import trio.testing

from tests.cluster.test_node_rules import FakeRegistry, FakeStore, llm_engine
from yard.cluster.forward import Forwarder
from yard.cluster.jobs import ClusterJobStore
from yard.cluster.listen import Listener
from yard.cluster.node import Node
from yard.cluster.pg import DatabaseLost
from yard.cluster.registry import Registry
from yard.cluster.schema import ENDED_CHANNEL
from yard.config import BackendConfig, Config, ServerConfig
from yard.config.cluster import ClusterConfig
from yard.core.spec import SchedulerConfig
from yard.jobs.records import JobRecord

HEARTBEAT_S = 1.0


class EndedListener:
    """Announces job ends on ``yard_job_ended`` when the test says."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._event = trio.Event()

    def ended(self, job_id: str) -> None:
        self._ids.add(job_id)
        self._event.set()

    async def wait(self, timeout: float | None = None) -> AbstractSet[str]:  # noqa: ASYNC109
        while not self._ids:
            self._event = trio.Event()
            await self._event.wait()
        return frozenset({ENDED_CHANNEL})

    def payloads(self, channel: str) -> frozenset[str] | None:
        found, self._ids = frozenset(self._ids), set()
        return found

    async def __aenter__(self) -> EndedListener:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


class LostJobs:
    """The job service's side: each look-up fails while :attr:`lost`."""

    def __init__(self) -> None:
        self.lost = False
        self.looked: list[frozenset[str] | None] = []

    def enqueue(self, job: JobRecord, *, arrived_at_wall: float | None = None) -> None:
        raise AssertionError("nothing is claimed here")

    async def ended_elsewhere(self, job_ids: AbstractSet[str] | None) -> None:
        await trio.sleep(0.001)
        if self.lost:
            raise DatabaseLost("cannot reach PostgreSQL (the test stopped it)")
        self.looked.append(None if job_ids is None else frozenset(job_ids))


async def test_a_job_end_heard_as_the_database_is_lost_does_not_stop_the_node(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = Config(
        path=Path("/nonexistent/yard.toml"),
        server=ServerConfig(),
        scheduler=SchedulerConfig(),
        devices={},
        apps={},
        backends={"llm": BackendConfig(name="llm", models=("tiny",), command=("true",))},
    )
    cluster = ClusterConfig(
        database="postgresql:///x", node="a", heartbeat_s=HEARTBEAT_S, dead_after_s=3.0
    )
    registry = FakeRegistry()
    listener = EndedListener()
    jobs = LostJobs()
    node = Node(
        config=config,
        cluster=cluster,
        engine=llm_engine(),
        jobs=jobs,
        store=cast(ClusterJobStore, FakeStore(gone=registry.gone)),
        registry=cast(Registry, registry),
        listen=lambda: cast(Listener, listener),
        forwarder=Forwarder(node="a", secret=None, pool=cast(Any, None)),
        wall=trio.current_time,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        listener.ended("job_1")
        await trio.sleep(0.1)
        assert jobs.looked == [frozenset({"job_1"})]

        jobs.lost = True
        listener.ended("job_2")
        await trio.sleep(0.1)
        # Still running, and it says so.
        assert not node.database_ok
        assert node.health()["database"] == "lost"

        jobs.lost = False
        await trio.sleep(2 * HEARTBEAT_S)
        # Back: every job is looked at again (job_2's end may be among them).
        assert jobs.looked == [frozenset({"job_1"}), None]
        listener.ended("job_3")
        await trio.sleep(0.1)
        assert jobs.looked[-1] == frozenset({"job_3"})
        nursery.cancel_scope.cancel()
