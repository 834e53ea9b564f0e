"""An httpx client for tests that kill the server under it.

httpcore sends a request body with ``async for chunk in request.stream`` and,
when a write fails (the server was killed, the connection reset) or the
request is cancelled, leaves that loop without closing the iterator. httpx's
bodies (``ByteStream``) iterate with an async generator, so an abandoned one
is collected later and Trio warns (``ResourceWarning: Async generator
'httpx._content.ByteStream.__aiter__' was garbage collected before it had
been exhausted``; encode/httpx#3686). Under ``filterwarnings = error`` that
fails whichever test happens to be running when the collector runs.

:func:`client` sends every body as a :class:`PlainBody`, whose iterator is an
object, not a generator: abandoning it leaves nothing to finalize.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx


class _Once:
    """An async iterator that yields ``data`` once (empty bodies: nothing)."""

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data or None

    def __aiter__(self) -> _Once:
        return self

    async def __anext__(self) -> bytes:
        data, self._data = self._data, None
        if data is None:
            raise StopAsyncIteration
        return data


class PlainBody(httpx.AsyncByteStream):
    """A request body in memory, iterated without an async generator."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _Once(self.data)


async def _plain_body(request: httpx.Request) -> None:
    # Every body these tests send is in memory already (json=, content=bytes).
    request.stream = PlainBody(request.content)


def client(base_url: str, **kwargs: Any) -> httpx.AsyncClient:
    """``httpx.AsyncClient(base_url=..., **kwargs)`` whose requests send their
    bodies as :class:`PlainBody`."""
    return httpx.AsyncClient(
        base_url=base_url, event_hooks={"request": [_plain_body], "response": []}, **kwargs
    )
