"""The node registry against a real PostgreSQL: publish, read, find the
stale, and declare a node gone exactly once."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from yard.cluster.pg import PgDatabase
from yard.cluster.registry import NodeState, Registry
from yard.cluster.schema import MIGRATIONS


@pytest.fixture
async def db(postgres_dsn: str) -> AsyncIterator[PgDatabase]:
    db = await PgDatabase.open(postgres_dsn, MIGRATIONS)
    try:
        yield db
    finally:
        await db.close()


def node(name: str, heartbeat_at: float, **changes: Any) -> NodeState:
    state = NodeState(
        name=name,
        url=f"http://{name}:8080",
        heartbeat_at=heartbeat_at,
        started_at=10.0,
        serves=("voice", "chat"),
        backends=("tts", "llm"),
        loaded=("tts",),
        free_mib={"gpu0": 1024.5},
        queues={"tts": 2, "llm": 0},
        gpu_models=("NVIDIA H200",),
    )
    return dataclasses.replace(state, **changes)


async def test_a_published_state_reads_back_and_the_latest_wins(db: PgDatabase) -> None:
    registry = Registry(db)
    await registry.publish(node("b", 100.0))
    await registry.publish(node("a", 100.0))
    await registry.publish(node("a", 102.0, loaded=(), database_ok=False))
    latest = node("a", 102.0, loaded=(), database_ok=False)
    assert await registry.nodes() == [latest, node("b", 100.0)]
    assert await registry.node("b") == node("b", 100.0)
    assert await registry.node("c") is None
    with pytest.raises(ValueError, match="'up' or 'gone'"):
        await registry.publish(node("a", 103.0, state="dead"))


async def test_only_one_of_two_nodes_declares_a_stale_node_gone(db: PgDatabase) -> None:
    one, two = Registry(db), Registry(db)
    await one.publish(node("dead", 100.0))
    await one.publish(node("alive", 109.0))
    assert await one.stale(now=111.0, after_s=10.0) == ["dead"]
    won: list[bool] = []

    async def declare(registry: Registry) -> None:
        won.append(await registry.mark_gone("dead", heartbeat_before=101.0))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(declare, one)
            nursery.start_soon(declare, two)
    assert sorted(won) == [False, True]
    assert await one.stale(now=111.0, after_s=10.0) == []
    gone = await one.node("dead")
    assert gone is not None and gone.state == "gone"
    # Back: it publishes again and is up.
    await two.publish(node("dead", 120.0))
    assert [n.state for n in await two.nodes()] == ["up", "up"]


async def test_a_node_that_beat_after_the_check_is_not_declared_gone(db: PgDatabase) -> None:
    registry = Registry(db)
    await registry.publish(node("slow", 100.0))
    assert await registry.stale(now=111.0, after_s=10.0) == ["slow"]
    await registry.publish(node("slow", 111.5))  # its heartbeat arrives just now
    assert not await registry.mark_gone("slow", heartbeat_before=101.0)
    assert await registry.mark_gone("slow")
    assert not await registry.forget("unknown")
    assert await registry.forget("slow")
    assert await registry.nodes() == []
