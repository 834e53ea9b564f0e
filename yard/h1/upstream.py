"""yard's upstream client: one request to a backend, its response streamed back.

:class:`ProxyRequest` is a client request after yard has read and checked it
(route, app, priority, deadline). :func:`forward` sends it to a backend and
yields the response as it arrives: status and headers first, then the body
chunk by chunk, never buffered. The gateway (``yard.http``) and the job
service (``yard.jobs``) both call it; it knows neither.

Rules this module keeps:

- Bodies are bytes and go through unchanged, in both directions.
- It never retries. A pooled keep-alive connection is checked before it is
  reused (a closed one is dropped), so that a request is written at most once.
- A pooled connection is not reused once it has been idle for half the
  keep-alive timeout the backend announced (``Keep-Alive: timeout=5`` from
  llama.cpp's server), or :data:`DEFAULT_IDLE_S` when it announced none: a
  request written just as the backend's timer closes the connection is lost
  (the server closes with the request unread, the kernel answers RST) and
  its client would get a 502 "connection broke", although the backend is
  healthy. The check above cannot see a close that has not happened yet; the
  age can. A new connection costs about 0.1 ms on loopback.
- Responses are read with :class:`yard.h1.wire.ClientConnection`, the same
  sans-I/O HTTP/1.1 code as the server side (h11 cost a third of the proxy's
  time per request). What a backend sends that could not go on to a client
  as a well-formed response (conflicting framing, a line break in a header,
  a status below 100, a head over 64 KiB) is an :class:`UpstreamError`
  before the client sees any of it.
- A connection goes back to the pool only after a complete, reusable exchange;
  anything else (an error, a cancel, a response not read to the end) closes it.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import trio

from yard.h1 import sockio, wire

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

DEFAULT_IDLE_S = 2.0
"""How long a pooled connection may stay idle and still be reused when the
backend did not say how long it keeps one (uvicorn and Node keep 5 s)."""


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
    app: the name of the app that sent it.
    priority: its base priority, already clamped to the app's range.
    start_by: latest start on the engine clock, or None.
    allow_late: run it even when the deadline cannot be met.
    request_id: yard's id for it (also the job id's request, for jobs).
    model: the ``model`` it named, if it came through ``/v1``.
    not_before: earliest start on the engine clock, or None (a time window).
    window_label: how people read ``not_before`` ("13:50:00Z (X-Yard-Not-Before)").
    """

    method: str
    path: str
    query: bytes
    headers: Headers
    body: bytes
    backend: str
    app: str
    priority: float
    start_by: float | None
    allow_late: bool
    request_id: str
    model: str | None = None
    not_before: float | None = None
    window_label: str = ""

    @property
    def target(self) -> bytes:
        """The request target sent upstream: path plus query."""
        path = self.path.encode("latin-1")
        return path + b"?" + self.query if self.query else path


class UpstreamError(Exception):
    """The backend could not be reached, or its connection broke.

    response_started: the response had been handed to the caller (status
        and headers), so its client may already have received bytes. A
        response found broken before that (its head, or the part of its
        body that came with the head) raises with False.
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
    """One HTTP/1.1 connection to a backend: a trio socket stream and the
    state of its responses."""

    __slots__ = ("idle_since", "keep_s", "stream", "wire")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.wire = wire.ClientConnection(max_head=_HEAD_LIMIT)
        # Set when it goes back to the pool: since when, and for how long it
        # may be reused.
        self.idle_since = 0.0
        self.keep_s = DEFAULT_IDLE_S

    def is_reusable(self, now: float) -> bool:
        # Too old: the backend may be closing it right now (see the module).
        if now - self.idle_since >= self.keep_s:
            return False
        # A keep-alive connection the server closed (idle timeout, restart)
        # reads as "readable" (EOF); one with stray bytes is unusable too.
        return self.wire.reusable and not self.stream.socket.is_readable()

    async def send(self, data: Sequence[bytes]) -> None:
        # One write for small requests (each write wakes the backend); large
        # bodies go as they are rather than being copied into one buffer.
        if sum(map(len, data)) <= _JOIN_LIMIT:
            await sockio.send_all(self.stream, b"".join(data))
            return
        for piece in data:
            if piece:
                await sockio.send_all(self.stream, piece)

    async def fill(self) -> None:
        """Read more bytes for the response (``b""`` when the peer closed)."""
        self.wire.receive_data(await sockio.receive_some(self.stream, _READ_SIZE))


class UpstreamPool:
    """Keep-alive connections to backends, reused across requests."""

    def __init__(self, *, max_idle_per_host: int = _MAX_IDLE_PER_HOST) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._max_idle = max_idle_per_host

    async def _acquire(self, origin: _Origin) -> _Connection:
        idle = self._idle.get((origin.host, origin.port))
        now = trio.current_time()
        while idle:
            conn = idle.pop()
            if conn.is_reusable(now):
                return conn
            conn.stream.socket.close()
        try:
            stream = await trio.open_tcp_stream(origin.host, origin.port)
        except OSError as exc:
            raise UpstreamError(
                f"cannot connect to {origin.host}:{origin.port}: {exc}", response_started=False
            ) from exc
        return _Connection(stream)

    def _release(self, origin: _Origin, conn: _Connection, headers: Headers) -> None:
        idle = self._idle.setdefault((origin.host, origin.port), [])
        if len(idle) < self._max_idle:
            conn.idle_since = trio.current_time()
            conn.keep_s = keep_alive_s(headers)
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

        ``headers`` must be well-formed (as parsed from a client, or yard's
        own): they are written as they are. Raises :class:`UpstreamError` if
        the backend cannot be reached or the connection breaks. Leaving the
        block before the body was read to its end closes the connection
        (which cancels the request upstream).
        """
        origin = _origin(base_url)
        conn = await self._acquire(origin)
        response: UpstreamResponse | None = None
        try:
            lines = [
                b"%s %s HTTP/1.1\r\nhost: %s\r\n"
                % (method, origin.prefix + target, origin.host_header)
            ]
            lines += [b"%s: %s\r\n" % pair for pair in headers]
            if body or method not in (b"GET", b"HEAD", b"DELETE", b"OPTIONS"):
                lines.append(b"content-length: %d\r\n" % len(body))
            lines.append(b"\r\n")
            try:
                await conn.send([b"".join(lines), body])
                response = await UpstreamResponse.read_head(conn, method)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise UpstreamError(
                    f"connection to the backend broke: {exc}", response_started=False
                ) from exc
            except wire.ProtocolError as exc:
                raise UpstreamError(
                    f"the backend's answer cannot be passed on: {exc}", response_started=False
                ) from exc
            yield response
        finally:
            if response is not None and response.complete and conn.wire.reusable:
                self._release(origin, conn, response.headers)
            else:
                conn.stream.socket.close()


def keep_alive_s(headers: Headers) -> float:
    """How long a connection may be reused after a response with ``headers``
    (names lower-cased, as :class:`yard.h1.wire.Response` hands them): half
    the ``Keep-Alive: timeout=N`` the backend sent, else :data:`DEFAULT_IDLE_S`."""
    for name, value in headers:
        if name != b"keep-alive":
            continue
        for part in value.split(b","):
            key, _, number = part.strip().partition(b"=")
            if key.strip().lower() == b"timeout":
                try:
                    seconds = float(number.strip())
                except ValueError:
                    break
                if seconds >= 0:
                    return min(seconds, 3600.0) / 2
    return DEFAULT_IDLE_S


_HEAD_LIMIT = 64 * 1024
"""The longest response head accepted from a backend, as for clients."""

# (Module globals: one lookup each on the hot path, not two.)
_Data = wire.Data
_EndOfMessage = wire.EndOfMessage
_Response = wire.Response
_NEED_DATA = wire.NEED_DATA


class UpstreamResponse:
    """A backend's response: status and headers now, body as it arrives.

    Framing is RFC 9112 section 6 as :class:`yard.h1.wire.ClientConnection`
    reads it: no body for HEAD, 1xx, 204 and 304; chunked transfer coding;
    Content-Length; otherwise until the backend closes the connection.
    """

    __slots__ = ("_conn", "_next", "complete", "headers", "reason", "status")

    def __init__(self, conn: _Connection, head: wire.Response) -> None:
        self._conn = conn
        self.status = head.status
        self.reason = head.reason
        self.headers = head.headers
        self.complete = False
        # What of the body came with the head (so the head can go on with
        # it in one write), or its end.
        self._next: bytes | None = None
        event = conn.wire.next_event()
        if type(event) is _Data:
            self._next = event.data
        elif type(event) is _EndOfMessage:
            self.complete = True

    @classmethod
    async def read_head(cls, conn: _Connection, method: bytes) -> UpstreamResponse:
        """Read the response to the ``method`` request just sent on ``conn``."""
        conn.wire.request_sent(method)
        while True:
            event = conn.wire.next_event()
            if type(event) is _Response:
                return cls(conn, event)
            await conn.fill()

    @property
    def reusable(self) -> bool:
        """Whether the connection can carry another request: the response
        ended, the backend keeps the connection and sent nothing more."""
        return self.complete and self._conn.wire.reusable

    def buffered(self) -> bool:
        """Whether more of the body (or its end) has already arrived, so the
        next chunk is available without waiting."""
        return self.complete or self._next is not None or self._conn.wire.buffered > 0

    def chunks(self) -> UpstreamResponse:
        """The body, chunk by chunk as the backend sends it (``async for``).

        Raises :class:`UpstreamError` (``response_started=True``) if the
        connection breaks before the body is complete, or the body breaks
        its framing.
        """
        return self

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        # A plain iterator, not an async generator: leaving the loop early
        # (client gone) must not leave a generator for the GC to finalize.
        data = self._next
        if data is not None:
            self._next = None
            return data
        conn = self._conn
        try:
            while not self.complete:
                event = conn.wire.next_event()
                if type(event) is _Data:
                    return event.data
                if event is _NEED_DATA:
                    await conn.fill()
                else:
                    self.complete = True
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise UpstreamError(
                f"connection to the backend broke mid-response: {exc}", response_started=True
            ) from exc
        except wire.ProtocolError as exc:
            raise UpstreamError(
                f"the backend's response is malformed: {exc}", response_started=True
            ) from exc
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
