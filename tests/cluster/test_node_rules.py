"""The node's rules on virtual time, with fakes beside the database: when it
claims, when it does not ask the database, and who reaps a dead node.

(The same rules on real processes and a real PostgreSQL: test_nodes*.py.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import trio
import trio.testing

from yard.cluster.forward import Forwarder
from yard.cluster.jobs import ClusterJobStore
from yard.cluster.listen import Listener
from yard.cluster.node import Node
from yard.cluster.reaping import ReapSummary
from yard.cluster.registry import NodeState, Registry
from yard.cluster.schema import JOBS_CHANNEL
from yard.config import BackendConfig, Config, ServerConfig
from yard.config.cluster import ClusterConfig
from yard.core.spec import SchedulerConfig
from yard.db import DatabaseLost
from yard.jobs.records import JobRecord
from yard.testing.engine import FakeEngine

HEARTBEAT_S = 1.0
DEAD_AFTER_S = 3.0


def llm_engine(state: str = "ready") -> FakeEngine:
    """An engine whose one backend, llm, is in ``state``."""
    engine = FakeEngine()
    engine.set_backend("llm", state=state)
    return engine


@dataclass
class FakeStore:
    """The claim side of ClusterJobStore: an empty shared queue, counted."""

    claims: list[tuple[str, ...]] = field(default_factory=list)
    reaped: list[str] = field(default_factory=list)
    reaped_at: list[float] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)  # the registry's

    async def claim(
        self, node: str, backends: Sequence[str], *, prefer: Sequence[str] = ()
    ) -> JobRecord | None:
        self.claims.append(tuple(backends))
        await trio.sleep(0.001)
        return None

    async def reap(self, node: str, *, now: float) -> ReapSummary:
        self.reaped.append(node)
        self.reaped_at.append(trio.current_time())
        return ReapSummary()

    async def reap_gone(
        self, node: str, *, now: float, heartbeat_before: float | None
    ) -> ReapSummary | None:
        if node in self.gone:
            return None
        self.gone.add(node)
        return await self.reap(node, now=now)


@dataclass
class FakeRegistry:
    """The registry; while :attr:`lost`, every call fails as a stopped
    PostgreSQL does (the calls a node makes at a heartbeat)."""

    others: list[NodeState] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)
    published: list[NodeState] = field(default_factory=list)
    lost: bool = False

    def _check(self) -> None:
        if self.lost:
            raise DatabaseLost("cannot reach PostgreSQL (the test stopped it)")

    def beat(self, name: str, at: float) -> None:
        """Another node publishes a heartbeat at ``at`` (if it can)."""
        if not self.lost:
            self.others = [
                replace(n, heartbeat_at=at) if n.name == name else n for n in self.others
            ]

    async def publish(self, state: NodeState) -> None:
        self._check()
        self.published.append(state)

    async def nodes(self) -> list[NodeState]:
        self._check()
        mine = self.published[-1:]
        return [
            *mine,
            *(_with_state(n, "gone" if n.name in self.gone else n.state) for n in self.others),
        ]

    async def stale(self, now: float, after_s: float) -> list[str]:
        self._check()
        return [
            n.name
            for n in self.others
            if n.heartbeat_at < now - after_s and n.name not in self.gone
        ]

    async def mark_gone(self, name: str, *, heartbeat_before: float | None = None) -> bool:
        if name in self.gone:
            return False
        self.gone.add(name)
        return True


def _with_state(node: NodeState, state: str) -> NodeState:
    return NodeState(
        name=node.name,
        url=node.url,
        heartbeat_at=node.heartbeat_at,
        started_at=node.started_at,
        serves=node.serves,
        backends=node.backends,
        loaded=node.loaded,
        state=state,
    )


class FakeListener:
    """Announcements the test makes with :meth:`announce`."""

    def __init__(self) -> None:
        self._pending: set[str] = set()
        self._backends: set[str] = set()
        self._event = trio.Event()

    def announce(self, backend: str) -> None:
        self._pending.add(JOBS_CHANNEL)
        self._backends.add(backend)
        self._event.set()

    async def wait(self, timeout: float | None = None) -> AbstractSet[str]:  # noqa: ASYNC109
        while not self._pending:
            self._event = trio.Event()
            await self._event.wait()
        fired, self._pending = frozenset(self._pending), set()
        return fired

    def payloads(self, channel: str) -> frozenset[str] | None:
        found, self._backends = frozenset(self._backends), set()
        return found

    async def __aenter__(self) -> FakeListener:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


@dataclass
class Harness:
    node: Node
    engine: FakeEngine
    store: FakeStore
    registry: FakeRegistry
    listener: FakeListener


@asynccontextmanager
async def running_node(
    *, state: str = "ready", others: Sequence[NodeState] = ()
) -> AsyncIterator[Harness]:
    config = Config(
        path=Path("/nonexistent/yard.toml"),
        server=ServerConfig(),
        scheduler=SchedulerConfig(),
        devices={},
        apps={},
        backends={"llm": BackendConfig(name="llm", models=("tiny",), command=("true",))},
    )
    cluster = ClusterConfig(
        database="postgresql:///x",
        node="a",
        heartbeat_s=HEARTBEAT_S,
        dead_after_s=DEAD_AFTER_S,
    )
    engine = llm_engine(state)
    registry = FakeRegistry(others=list(others))
    store = FakeStore(gone=registry.gone)
    listener = FakeListener()
    node = Node(
        config=config,
        cluster=cluster,
        engine=engine,
        jobs=cast(Any, None),
        store=cast(ClusterJobStore, store),
        registry=cast(Registry, registry),
        listen=lambda: cast(Listener, listener),
        forwarder=Forwarder(node="a", secret=None, pool=cast(Any, None)),
        wall=trio.current_time,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        yield Harness(node, engine, store, registry, listener)
        nursery.cancel_scope.cancel()


def _other(
    name: str, *, loaded: tuple[str, ...] = ("llm",), heartbeat_at: float = 0.0
) -> NodeState:
    return NodeState(
        name=name,
        url=f"http://{name}:1",
        heartbeat_at=heartbeat_at,
        started_at=0.0,
        serves=("tiny",),
        backends=("llm",),
        loaded=loaded,
    )


async def test_an_empty_queue_is_asked_again_only_once_a_job_is_announced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_node() as h:
        await trio.sleep(0.1)
        assert h.store.claims == [("llm",)]
        # Room keeps appearing (dispatches, finishes): the database is not asked.
        for _ in range(5):
            h.node.wake()
            await trio.sleep(0.01)
        assert h.store.claims == [("llm",)]
        # A job announced for the backend: asked at once.
        h.listener.announce("llm")
        await trio.sleep(0.01)
        assert h.store.claims == [("llm",)] * 2
        # Announced for another backend: not.
        h.listener.announce("other")
        await trio.sleep(0.01)
        assert len(h.store.claims) == 2
        # Each heartbeat looks again, in case an announcement was lost.
        await trio.sleep(HEARTBEAT_S)
        assert len(h.store.claims) == 3


async def test_a_node_with_a_stale_heartbeat_holds_its_backends_until_it_is_reaped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # c had llm loaded and stopped sending heartbeats at 0; here llm is stopped.
    async with running_node(state="stopped", others=[_other("c")]) as h:
        await trio.sleep(DEAD_AFTER_S - 0.5)
        assert h.store.claims == []  # c has it: its jobs are c's
        assert h.store.reaped == []
        await trio.sleep(2 * HEARTBEAT_S)
        # Found dead by a heartbeat: reaped, and only then does this node claim.
        assert h.store.reaped == ["c"]
        assert h.store.claims == [("llm",)]
        # Gone stays gone: reaped once.
        await trio.sleep(3 * HEARTBEAT_S)
        assert h.store.reaped == ["c"]


async def test_a_dead_node_another_node_marked_gone_first_is_not_reaped_twice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_node(others=[_other("c")]) as h:
        h.registry.gone.add("c")  # another node won mark_gone
        await trio.sleep(DEAD_AFTER_S + 2 * HEARTBEAT_S)
        assert h.store.reaped == []


async def _beating(registry: FakeRegistry, name: str, *, phase: float, until: float) -> None:
    """Node ``name`` publishes every heartbeat, ``phase`` s after this node."""
    await trio.sleep(phase)
    while trio.current_time() < until:
        registry.beat(name, trio.current_time())
        await trio.sleep(HEARTBEAT_S)


async def test_a_peer_silent_through_a_database_outage_is_not_reaped_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The database is away from 5.2 s to 17.7 s (12.5 s, four times
    # dead_after_s); c's heartbeats land half a heartbeat after this node's, so
    # this node's lands first after the outage (18 s; c's: 18.5 s). Before the
    # watch rule it found c's last heartbeat (4.5 s) older than dead_after_s
    # and reaped c, alive.
    async with running_node(others=[_other("c")]) as h, trio.open_nursery() as nursery:
        nursery.start_soon(partial(_beating, h.registry, "c", phase=0.5, until=60.0))
        await trio.sleep(5.2)
        h.registry.lost = True
        await trio.sleep(12.5)
        h.registry.lost = False
        await trio.sleep(20.0)
        assert h.store.reaped == []
        assert h.node.database_ok
        nursery.cancel_scope.cancel()


async def test_a_peer_that_died_in_an_outage_is_reaped_dead_after_s_after_the_watch_resumes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_node(others=[_other("c")]) as h, trio.open_nursery() as nursery:
        nursery.start_soon(partial(_beating, h.registry, "c", phase=0.5, until=5.0))
        await trio.sleep(5.2)
        h.registry.lost = True
        await trio.sleep(12.0)
        h.registry.lost = False  # at 17.2; this node's next heartbeat: 18 s
        await trio.sleep(10.0)
        nursery.cancel_scope.cancel()
    # Watching again from 18 s: judged at the first heartbeat 3 s after that.
    assert h.store.reaped == ["c"]
    assert h.store.reaped_at == [21.0]


async def test_while_cut_off_a_node_routes_to_its_peers_as_last_seen(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_node(others=[_other("c")]) as h, trio.open_nursery() as nursery:
        nursery.start_soon(partial(_beating, h.registry, "c", phase=0.5, until=5.0))
        await trio.sleep(5.2)
        h.registry.lost = True
        await trio.sleep(12.0)  # c's last heartbeat is 11.7 s old
        (c,) = [p for p in h.node.forwarder.peers if p.name == "c"]
        assert c.up  # not judged by the clock while this node cannot see
        nursery.cancel_scope.cancel()
