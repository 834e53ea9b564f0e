"""The job service's tests' harness: a wall clock that runs with trio's
virtual one, a request to hand in, and ``running_jobs``, the service over a
store, the fake engine (:class:`yard.testing.engine.FakeEngine`) and the fake
upstream (:class:`yard.testing.upstream.FakeUpstream`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from yard.config import JobsConfig
from yard.h1.upstream import ProxyRequest
from yard.http.ports import JobService
from yard.jobs.service import Jobs
from yard.jobs.store import JobStore
from yard.testing.engine import FakeEngine
from yard.testing.upstream import FakeUpstream

EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the wall clock at virtual time 0


def wall() -> float:
    """A wall clock that runs with trio's (virtual) clock."""
    return EPOCH + trio.current_time()


def proxy_request(
    *,
    app: str = "radio",
    body: bytes = b'{"model": "voice", "input": "hello"}',
    priority: float = 50.0,
    start_by: float | None = None,
    allow_late: bool = False,
    path: str = "/v1/audio/speech",
) -> ProxyRequest:
    return ProxyRequest(
        method="POST",
        path=path,
        query=b"",
        headers=[(b"content-type", b"application/json")],
        body=body,
        backend="tts",
        app=app,
        priority=priority,
        start_by=start_by,
        allow_late=allow_late,
        request_id="req-1",
        model="voice",
    )


@asynccontextmanager
async def running_jobs(
    path: Path,
    *,
    engine: FakeEngine | None = None,
    upstream: FakeUpstream | None = None,
    config: JobsConfig | None = None,
) -> AsyncIterator[Jobs]:
    """A started job service on ``path`` (a jobs.sqlite), stopped on exit."""
    store = await JobStore.open(path, threaded=False)
    jobs = Jobs(
        engine=engine or FakeEngine(),
        store=store,
        upstream=upstream or FakeUpstream(),
        config=config or JobsConfig(),
        wall=wall,
    )
    service: JobService = jobs  # the gateway's protocol, checked by mypy
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(jobs.run)
            assert service is jobs
            yield jobs
            nursery.cancel_scope.cancel()
    finally:
        await store.close()


async def settle() -> None:
    """Let every task run until all are blocked (virtual time does not move
    unless something sleeps)."""
    await trio.testing.wait_all_tasks_blocked()


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    while not await check():
        await settle()
