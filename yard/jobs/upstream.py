"""How a job's request reaches its backend and its whole answer comes back.

:func:`fetch` sends a stored request to the backend a job was dispatched to
and reads the whole answer into a :class:`~yard.jobs.store.StoredResult`, up
to ``max_result_bytes``. The transport is an :data:`Upstream`: the gateway's
:func:`yard.h1.upstream.forward` over its connection pool in production, a fake
in tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from yard.h1.upstream import ProxyRequest, UpstreamPool, forward
from yard.jobs.store import JobRecord, StoredRequest, StoredResult


class UpstreamResponseLike(Protocol):
    """What a runner reads of :class:`yard.h1.upstream.UpstreamResponse`."""

    status: int
    headers: list[tuple[bytes, bytes]]

    def chunks(self) -> AsyncIterator[bytes]: ...


Upstream = Callable[[ProxyRequest, str], AbstractAsyncContextManager[UpstreamResponseLike]]
"""Sends a request to a backend's base URL: :func:`yard.h1.upstream.forward`
(with the gateway's pool), or a fake in tests. Raises ``UpstreamError``."""


class ResultTooLarge(Exception):
    """The backend's answer is larger than a job stores (the message says how
    much and names the key)."""


def pooled(pool: UpstreamPool | None) -> Upstream:
    """The production :data:`Upstream`: ``forward`` over ``pool``."""

    def call(
        request: ProxyRequest, base_url: str
    ) -> AbstractAsyncContextManager[UpstreamResponseLike]:
        return forward(request, base_url, pool=pool)

    return call


async def fetch(
    upstream: Upstream, job: JobRecord, stored: StoredRequest, base_url: str, *, limit: int
) -> StoredResult:
    """Send ``job``'s ``stored`` request to ``base_url`` and return the whole
    answer. Raises :class:`ResultTooLarge` past ``limit`` bytes of body (the
    upstream call is closed at once), and ``UpstreamError`` as the upstream
    does."""
    request = ProxyRequest(
        method=stored.method,
        path=stored.path,
        query=stored.query.encode("latin-1"),
        # The backend (its log, a counter file) can tell which job this is.
        headers=[*stored.headers, (b"x-yard-request-id", job.id.encode())],
        body=stored.body,
        backend=job.backend,
        app=job.app,
        priority=job.priority,
        start_by=None,
        allow_late=job.allow_late,
        request_id=job.id,
        model=job.model,
    )
    async with upstream(request, base_url) as response:
        parts: list[bytes] = []
        size = 0
        chunks = response.chunks()
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise ResultTooLarge(
                        f"the backend's answer is larger than {limit} bytes, the most a job "
                        "stores ([jobs] max_result_bytes)"
                    )
                parts.append(chunk)
        finally:
            # Leaving early (too large) must close the generator now, not
            # whenever it is garbage-collected.
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        return StoredResult(
            status=response.status, headers=tuple(response.headers), body=b"".join(parts)
        )
