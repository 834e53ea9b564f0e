"""The upstream side of the proxy: one request to a backend, streamed back.

:class:`ProxyRequest` is a client request after yard has read and checked it
(route, app, priority, deadline). :func:`forward` sends it to a backend and
yields the response as it arrives: status and headers first, then the body
chunk by chunk, never buffered. The synchronous proxy and the job runner both
call it.

Rules this module keeps:

- Bodies are bytes and go through unchanged, in both directions.
- It never retries. A pooled keep-alive connection is checked before it is
  reused (a closed one is dropped), so that a request is written at most once.
- A connection goes back to the pool only after a complete, reusable exchange;
  anything else (an error, a cancel, a response not read to the end) closes it.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import h11
import trio

from yard.http.server import header_pairs

if TYPE_CHECKING:
    from yard.config import AppConfig

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"expect",
    }
)
"""Headers about one connection, not the message: never forwarded."""

_READ_SIZE = 65536
_JOIN_LIMIT = 256 * 1024
_MAX_IDLE_PER_HOST = 128


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyRequest:
    """A client request, read and checked, ready to be sent to a backend.

    method: the HTTP method (``"POST"``).
    path: the path to request from the backend, as it came over the wire
        (percent-encoding kept; for ``/backends/NAME/PATH`` it is ``/PATH``).
    query: the raw query string, without ``?`` (``b""`` when none).
    headers: the client's headers to pass on (lower-case names), already
        without hop-by-hop headers, ``host``, ``content-length``, yard's own
        ``x-yard-*`` and ``prefer`` headers, and the API key yard consumed;
        with ``x-yard-request-id`` added.
    body: the request body, exactly as received.
    backend: the backend that serves it.
    app: the app that sent it.
    priority: its base priority, already clamped to the app's range.
    start_by: latest start on the engine clock, or None.
    allow_late: run it even when the deadline cannot be met.
    request_id: yard's id for it (also the job id's request, for jobs).
    model: the ``model`` it named, if it came through ``/v1``.
    """

    method: str
    path: str
    query: bytes
    headers: Headers
    body: bytes
    backend: str
    app: AppConfig
    priority: float
    start_by: float | None
    allow_late: bool
    request_id: str
    model: str | None = None

    @property
    def target(self) -> bytes:
        """The request target sent upstream: path plus query."""
        path = self.path.encode("latin-1")
        return path + b"?" + self.query if self.query else path


class UpstreamError(Exception):
    """The backend could not be reached, or its connection broke.

    response_started: the backend had already sent the status line and
        headers (so the client may already have received bytes).
    """

    def __init__(self, detail: str, *, response_started: bool) -> None:
        super().__init__(detail)
        self.detail = detail
        self.response_started = response_started


@dataclass(frozen=True, slots=True)
class _Origin:
    host: str
    port: int
    prefix: bytes
    host_header: bytes


@functools.lru_cache(maxsize=256)
def _origin(base_url: str) -> _Origin:
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"backend URL must be http://HOST:PORT, not {base_url!r}")
    port = parts.port or 80
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    return _Origin(
        host=host,
        port=port,
        prefix=parts.path.rstrip("/").encode(),
        host_header=f"{shown}:{port}".encode(),
    )


class _Connection:
    """One HTTP/1.1 connection to a backend (h11 over a trio socket stream)."""

    __slots__ = ("h11", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    def is_reusable(self) -> bool:
        # A keep-alive connection the server closed (idle timeout, restart)
        # reads as "readable" (EOF); one with stray bytes is unusable too.
        return not self.stream.socket.is_readable()

    async def send(self, data: Sequence[bytes]) -> None:
        # One write for small requests (each write wakes the backend); large
        # bodies go as they are rather than being copied into one buffer.
        if sum(map(len, data)) <= _JOIN_LIMIT:
            await self.stream.send_all(b"".join(data))
            return
        for piece in data:
            if piece:
                await self.stream.send_all(piece)

    async def next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                data = await self.stream.receive_some(_READ_SIZE)
                self.h11.receive_data(data)
                continue
            return event  # type: ignore[return-value]


class UpstreamPool:
    """Keep-alive connections to backends, reused across requests."""

    def __init__(self, *, max_idle_per_host: int = _MAX_IDLE_PER_HOST) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._max_idle = max_idle_per_host

    async def _acquire(self, origin: _Origin) -> _Connection:
        idle = self._idle.get((origin.host, origin.port))
        while idle:
            conn = idle.pop()
            if conn.is_reusable():
                return conn
            conn.stream.socket.close()
        try:
            stream = await trio.open_tcp_stream(origin.host, origin.port)
        except OSError as exc:
            raise UpstreamError(
                f"cannot connect to {origin.host}:{origin.port}: {exc}", response_started=False
            ) from exc
        return _Connection(stream)

    def _release(self, origin: _Origin, conn: _Connection) -> None:
        idle = self._idle.setdefault((origin.host, origin.port), [])
        if len(idle) < self._max_idle:
            idle.append(conn)
        else:
            conn.stream.socket.close()

    def close_idle(self) -> None:
        """Close every idle connection (at shutdown, or after a backend stopped)."""
        for conns in self._idle.values():
            for conn in conns:
                conn.stream.socket.close()
        self._idle.clear()

    @asynccontextmanager
    async def request(
        self, base_url: str, method: bytes, target: bytes, headers: Headers, body: bytes
    ) -> AsyncIterator[UpstreamResponse]:
        """Send one request to ``base_url`` and yield its response.

        Raises :class:`UpstreamError` if the backend cannot be reached or the
        connection breaks. Leaving the block before the body was read to its
        end closes the connection (which cancels the request upstream).
        """
        origin = _origin(base_url)
        conn = await self._acquire(origin)
        response: UpstreamResponse | None = None
        try:
            all_headers: Headers = [(b"host", origin.host_header)]
            all_headers += headers
            if body or method not in (b"GET", b"HEAD", b"DELETE", b"OPTIONS"):
                all_headers.append((b"content-length", b"%d" % len(body)))
            try:
                # _parsed: the headers are the client's as h11 parsed them, plus
                # yard's own; h11 need not run its validation regexes again.
                head = conn.h11.send(
                    h11.Request(
                        method=method,
                        target=origin.prefix + target,
                        headers=all_headers,
                        _parsed=True,
                    )
                )
                out = [head or b""]
                if body:
                    out += conn.h11.send_with_data_passthrough(h11.Data(data=body)) or []
                out.append(conn.h11.send(h11.EndOfMessage()) or b"")
                await conn.send(out)
                event = await conn.next_event()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise UpstreamError(
                    f"connection to the backend broke: {exc}", response_started=False
                ) from exc
            except h11.RemoteProtocolError as exc:
                raise UpstreamError(
                    f"the backend closed the connection without answering ({exc})",
                    response_started=False,
                ) from exc
            if not isinstance(event, h11.Response):
                raise UpstreamError(
                    f"the backend sent {type(event).__name__} instead of a response",
                    response_started=False,
                )
            response = UpstreamResponse(conn, event)
            yield response
        finally:
            if response is not None and response.complete and _can_reuse(conn):
                conn.h11.start_next_cycle()
                self._release(origin, conn)
            else:
                conn.stream.socket.close()


def _can_reuse(conn: _Connection) -> bool:
    return conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE


class UpstreamResponse:
    """A backend's response: status and headers now, body as it arrives."""

    __slots__ = ("_conn", "_stash", "complete", "headers", "reason", "status")

    def __init__(self, conn: _Connection, event: h11.Response) -> None:
        self._conn = conn
        self.status: int = event.status_code
        self.reason: bytes = event.reason
        self.headers: Headers = header_pairs(event.headers)
        self.complete = False
        self._stash: h11.Event | type[h11.PAUSED] | None = None

    def buffered(self) -> bool:
        """Whether more of the body (or its end) has already arrived, so the
        next chunk is available without waiting."""
        if self._stash is None and not self.complete:
            try:
                event = self._conn.h11.next_event()
            except h11.RemoteProtocolError:
                return False  # reading on raises it again, as UpstreamError
            if event is h11.NEED_DATA:
                return False
            self._stash = event  # type: ignore[assignment]
        return True

    def chunks(self) -> UpstreamResponse:
        """The body, chunk by chunk as the backend sends it (``async for``).

        Raises :class:`UpstreamError` (``response_started=True``) if the
        connection breaks before the body is complete.
        """
        return self

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        # A plain iterator, not an async generator: leaving the loop early
        # (client gone) must not leave a generator for the GC to finalize.
        conn = self._conn
        while not self.complete:
            try:
                if self._stash is not None:
                    event, self._stash = self._stash, None
                else:
                    event = await conn.next_event()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise UpstreamError(
                    f"connection to the backend broke mid-response: {exc}", response_started=True
                ) from exc
            except h11.RemoteProtocolError as exc:
                raise UpstreamError(
                    f"the backend's response was cut short ({exc})", response_started=True
                ) from exc
            if isinstance(event, h11.Data):
                if event.data:
                    return bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.complete = True
            else:
                raise UpstreamError(
                    f"unexpected {type(event).__name__} in the backend's response",
                    response_started=True,
                )
        raise StopAsyncIteration

    async def read(self) -> bytes:
        """The whole body (for callers that store it, like jobs)."""
        parts = [chunk async for chunk in self.chunks()]
        return b"".join(parts)


_default_pool: UpstreamPool | None = None


def default_pool() -> UpstreamPool:
    """The process-wide pool, for callers that were not given one."""
    global _default_pool
    if _default_pool is None:
        _default_pool = UpstreamPool()
    return _default_pool


@asynccontextmanager
async def forward(
    request: ProxyRequest, base_url: str, *, pool: UpstreamPool | None = None
) -> AsyncIterator[UpstreamResponse]:
    """Send ``request`` to the backend at ``base_url``; yield its response.

    The response's body is read with ``response.chunks()`` (streaming) or
    ``await response.read()``. Raises :class:`UpstreamError` when the backend
    cannot be reached or the connection breaks; its ``response_started`` tells
    whether status and headers had arrived. Cancelling the caller (or leaving
    the block early) closes the connection, which cancels the request at the
    backend. Nothing is ever retried.

    Example::

        async with forward(request, assignment.base_url) as response:
            async for chunk in response.chunks():
                ...
    """
    async with (pool or default_pool()).request(
        base_url, request.method.encode(), request.target, request.headers, request.body
    ) as response:
        yield response
