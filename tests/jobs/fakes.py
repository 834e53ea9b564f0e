"""Fakes beside the real engine and upstream, for the job service's tests.

``FakeEngine`` keeps a FIFO queue and lets the test dispatch, reject and
requeue by hand; ``FakeUpstream`` answers with scripted responses after a
scripted (virtual) delay. Both record what they were asked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from yard.admission import Assignment
from yard.config import JobsConfig
from yard.core.events import Outcome
from yard.core.views import QueuedView
from yard.errors import Rejected
from yard.h1.upstream import ProxyRequest, UpstreamError
from yard.http.ports import JobService
from yard.jobs.service import Jobs
from yard.jobs.store import JobStore
from yard.jobs.upstream import UpstreamResponseLike

EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: the wall clock at virtual time 0


def wall() -> float:
    """A wall clock that runs with trio's (virtual) clock."""
    return EPOCH + trio.current_time()


class FakeAdmission:
    def __init__(self, engine: FakeEngine, request_id: str, arrived_at: float) -> None:
        self.engine = engine
        self.request_id = request_id
        self.arrived_at = arrived_at
        self.queued_s = 0.0
        self._state = "queued"
        self._assignment: Assignment | None = None
        self._rejected: Rejected | None = None
        self._changed = trio.Event()
        self.reports: list[tuple[Outcome, str]] = []
        self.cancelled = False

    @property
    def state(self) -> str:
        return self._state

    def _set(self, state: str) -> None:
        self._state = state
        self._changed.set()
        self._changed = trio.Event()

    @property
    def assignment(self) -> Assignment | None:
        return self._assignment if self._state == "dispatched" else None

    async def wait_verdict(self) -> bool:
        await trio.lowlevel.checkpoint()
        while self._state == "lost":
            await self._changed.wait()
        return self._state in ("queued", "dispatched")

    async def wait_dispatched(self) -> Assignment:
        await trio.lowlevel.checkpoint()
        while True:
            if self._state == "dispatched":
                assert self._assignment is not None
                return self._assignment
            if self._state == "rejected":
                assert self._rejected is not None
                raise self._rejected
            if self._state == "cancelled":
                raise Rejected(status=499, code="cancelled", message="cancelled")
            await self._changed.wait()

    def report(self, outcome: Outcome = "ok", detail: str = "") -> None:
        if self._state != "dispatched":
            return
        self.reports.append((outcome, detail))
        self._set("lost" if outcome == "upstream_lost" else "done")

    def cancel(self) -> None:
        if self._state in ("done", "rejected", "cancelled"):
            return
        self.cancelled = True
        if self in self.engine.queue:
            self.engine.queue.remove(self)
        self._set("cancelled")


@dataclass
class Submitted:
    """One call of FakeEngine.submit, as made."""

    kwargs: dict[str, Any]
    at: float


class FakeEngine:
    """The engine's surface, with a FIFO queue the test drives by hand."""

    def __init__(self, *, offset: float = 0.0, auto_dispatch: str | None = None) -> None:
        # A fresh process's engine clock starts anywhere: offset moves it.
        self.offset = offset
        # A base URL: every request is dispatched there as soon as it arrives.
        self.auto_dispatch = auto_dispatch
        self.queue: list[FakeAdmission] = []
        self.admissions: dict[str, FakeAdmission] = {}
        self.submitted: list[Submitted] = []
        self.on_submit: Callable[[str], None] | None = None
        self.refuse: Rejected | None = None

    def now(self) -> float:
        return trio.current_time() + self.offset

    def submit(
        self,
        *,
        backend: str,
        priority: float,
        app: str = "",
        request_id: str | None = None,
        start_by: float | None = None,
        allow_late: bool = False,
        arrived_at: float | None = None,
        requeued: bool = False,
    ) -> FakeAdmission:
        assert request_id is not None
        if self.on_submit is not None:
            self.on_submit(request_id)
        if self.refuse is not None:
            raise self.refuse
        self.submitted.append(
            Submitted(
                kwargs={
                    "backend": backend,
                    "priority": priority,
                    "app": app,
                    "request_id": request_id,
                    "start_by": start_by,
                    "allow_late": allow_late,
                    "arrived_at": arrived_at,
                    "requeued": requeued,
                },
                at=self.now(),
            )
        )
        admission = FakeAdmission(
            self, request_id, self.now() if arrived_at is None else arrived_at
        )
        self.queue.append(admission)
        self.admissions[request_id] = admission
        if self.auto_dispatch is not None:
            self.dispatch(request_id, self.auto_dispatch)
        return admission

    def explain(self, request_id: str) -> QueuedView | None:
        for position, admission in enumerate(self.queue):
            if admission.request_id == request_id:
                return QueuedView(
                    request_id=request_id,
                    backend="tts",
                    app="",
                    priority=50.0,
                    effective_priority=50.0 + (self.now() - admission.arrived_at),
                    arrived_at=admission.arrived_at,
                    start_by=None,
                    position=position,
                    reason="waiting for tts to load",
                    estimated_start=self.now() + 10.0,
                )
        return None

    # -- driven by the test -------------------------------------------------------

    def dispatch(self, request_id: str, base_url: str = "http://backend") -> None:
        admission = self.admissions[request_id]
        assert admission.state in ("queued", "lost"), admission.state
        if admission in self.queue:
            self.queue.remove(admission)
        admission._assignment = Assignment(request_id=request_id, backend="tts", base_url=base_url)
        admission.queued_s = self.now() - admission.arrived_at
        admission._set("dispatched")

    def reject(self, request_id: str, code: str, status: int = 504, message: str = "") -> None:
        admission = self.admissions[request_id]
        if admission in self.queue:
            self.queue.remove(admission)
        admission._rejected = Rejected(status=status, code=code, message=message or code)
        admission._set("rejected")

    def requeue(self, request_id: str) -> None:
        admission = self.admissions[request_id]
        assert admission.state == "lost", admission.state
        self.queue.insert(0, admission)
        admission._set("queued")

    def shut_down(self) -> None:
        for admission in list(self.admissions.values()):
            if admission.state in ("queued", "dispatched", "lost"):
                admission._rejected = Rejected(status=503, code="shutting_down", message="bye")
                admission._set("rejected")


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
