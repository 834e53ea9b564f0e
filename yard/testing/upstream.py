"""The fake of the upstream client (:func:`yard.h1.upstream.forward` over the
pool), for what sends a request to a backend and reads the whole answer (the
job service's runner, :data:`yard.jobs.upstream.Upstream`).

:class:`FakeUpstream` answers each call with the next scripted :class:`Answer`
after its (virtual) delay, or raises the answer's
:class:`~yard.h1.upstream.UpstreamError` as the real client does when the
connection fails; it records every call and whether it was cancelled. For a
backend over real sockets, see :mod:`yard.testing.fake`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import trio

from yard.h1.upstream import ProxyRequest, UpstreamError

__all__ = ["Answer", "Call", "FakeResponse", "FakeUpstream"]


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
    """One call as made: the request, the base URL, when; whether it was
    cancelled while it waited, and whether its answer was read to the end."""

    request: ProxyRequest
    base_url: str
    at: float
    cancelled: bool = False
    finished: bool = False


class FakeResponse:
    """A scripted answer as the upstream client hands it over."""

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
    ) -> AbstractAsyncContextManager[FakeResponse]:
        return self._exchange(request, base_url)

    @asynccontextmanager
    async def _exchange(self, request: ProxyRequest, base_url: str) -> AsyncIterator[FakeResponse]:
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
        yield FakeResponse(answer)
        call.finished = True
