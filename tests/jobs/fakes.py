"""The job service's tests' harness: ``FakeUpstream`` answers with scripted
responses after a scripted (virtual) delay and records what it was asked;
``running_jobs`` runs the service over a store, the fake engine
(:class:`yard.testing.engine.FakeEngine`) and the fake upstream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from yard.config import JobsConfig
from yard.h1.upstream import ProxyRequest, UpstreamError
from yard.http.ports import JobService
from yard.jobs.service import Jobs
from yard.jobs.store import JobStore
from yard.jobs.upstream import UpstreamResponseLike
from yard.testing.engine import FakeEngine

EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the wall clock at virtual time 0


def wall() -> float:
    """A wall clock that runs with trio's (virtual) clock."""
    return EPOCH + trio.current_time()


@dataclass
class Answer:
    """A scripted backend answer: after ``delay`` seconds, ``status``,
    ``headers``, then ``chunks`` (or ``error`` raised instead)."""

    status: int = 200
    headers: list[tuple[bytes, bytes]] = field(
        default_factory=lambda: [(b"content-type", b"application/json")]
    )
    chunks: list[bytes] = field(default_factory=lambda: [b'{"ok": true}'])
    delay: float = 0.0
    error: UpstreamError | None = None


@dataclass
class Call:
    request: ProxyRequest
    base_url: str
    at: float
    cancelled: bool = False
    finished: bool = False


class _Response:
    def __init__(self, answer: Answer) -> None:
        self.status = answer.status
        self.headers = list(answer.headers)
        self._chunks = answer.chunks

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            await trio.lowlevel.checkpoint()
            yield chunk


class FakeUpstream:
    """Answers each call with the next scripted :class:`Answer` (the last one
    repeats). Records every call, and whether it was cancelled."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers) or [Answer()]
        self.calls: list[Call] = []

    def __call__(
        self, request: ProxyRequest, base_url: str
    ) -> AbstractAsyncContextManager[UpstreamResponseLike]:
        return self._exchange(request, base_url)

    @asynccontextmanager
    async def _exchange(self, request: ProxyRequest, base_url: str) -> AsyncIterator[_Response]:
        answer = self.answers[min(len(self.calls), len(self.answers) - 1)]
        call = Call(request=request, base_url=base_url, at=trio.current_time())
        self.calls.append(call)
        try:
            await trio.sleep(answer.delay)
        except trio.Cancelled:
            call.cancelled = True
            raise
        if answer.error is not None:
            raise answer.error
        yield _Response(answer)
        call.finished = True


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
