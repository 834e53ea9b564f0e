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
- It speaks HTTP/1.1 to backends with a small parser of its own (h11 cost a
  third of the proxy's time per request); the client side is still h11.
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

import trio

from yard.http import sockio

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
    """One HTTP/1.1 connection to a backend: a trio socket stream and the
    bytes read from it that nobody consumed yet."""

    __slots__ = ("buffer", "eof", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.eof = False

    def is_reusable(self) -> bool:
        # A keep-alive connection the server closed (idle timeout, restart)
        # reads as "readable" (EOF); one with stray bytes is unusable too.
        return not self.buffer and not self.stream.socket.is_readable()

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
        """Read more bytes into the buffer; sets ``eof`` when the peer closed."""
        data = await sockio.receive_some(self.stream, _READ_SIZE)
        if data:
            self.buffer += data
        else:
            self.eof = True


class _Malformed(Exception):
    """The backend's bytes are not HTTP/1.1 as yard understands it."""


def _parse_head(head: bytes) -> tuple[int, bytes, Headers, bool]:
    """Status line and headers -> (status, reason, headers, http/1.1?)."""
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise _Malformed(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: Headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name[-1:] in (b" ", b"\t") or name[:1] in (b" ", b"\t"):
            raise _Malformed(f"malformed header line: {line[:80]!r}")
        headers.append((name.lower(), value.strip(b" \t")))
    return int(code), reason, headers, version == b"HTTP/1.1"


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
                response = await UpstreamResponse.read_head(conn, method == b"HEAD")
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise UpstreamError(
                    f"connection to the backend broke: {exc}", response_started=False
                ) from exc
            except _Malformed as exc:
                raise UpstreamError(
                    f"the backend did not answer in HTTP/1.1: {exc}", response_started=False
                ) from exc
            yield response
        finally:
            if response is not None and response.complete and response.reusable:
                self._release(origin, conn)
            else:
                conn.stream.socket.close()


_HEAD_LIMIT = 64 * 1024


class UpstreamResponse:
    """A backend's response: status and headers now, body as it arrives.

    Framing follows RFC 9112 section 6: no body for HEAD, 1xx, 204 and 304;
    chunked transfer coding; Content-Length; otherwise until the backend
    closes the connection.
    """

    __slots__ = (
        "_chunk_left",
        "_conn",
        "_mode",
        "_remaining",
        "complete",
        "headers",
        "reason",
        "reusable",
        "status",
    )

    def __init__(
        self,
        conn: _Connection,
        status: int,
        reason: bytes,
        headers: Headers,
        keep_alive: bool,
        head_only: bool,
    ) -> None:
        self._conn = conn
        self.status = status
        self.reason = reason
        self.headers = headers
        self.complete = False
        self._remaining = 0
        self._chunk_left = 0
        length: bytes | None = None
        chunked = False
        close = not keep_alive
        for name, value in headers:
            if name == b"content-length":
                if length is not None and value != length:
                    raise _Malformed("conflicting Content-Length headers")
                length = value
            elif name == b"transfer-encoding":
                chunked = value.lower().rsplit(b",", 1)[-1].strip() == b"chunked"
                if not chunked:
                    close = True
            elif name == b"connection":
                tokens = {t.strip().lower() for t in value.split(b",")}
                if b"close" in tokens:
                    close = True
                elif b"keep-alive" in tokens and not keep_alive:
                    close = False
        if head_only or status in (204, 304):
            self._mode = "none"
            self.complete = True
        elif chunked:
            self._mode = "chunked"
        elif length is not None:
            if not length.isdigit():
                raise _Malformed(f"bad Content-Length {length[:40]!r}")
            self._mode = "length"
            self._remaining = int(length)
            self.complete = self._remaining == 0
        else:
            self._mode = "close"
            close = True
        self.reusable = not close

    @classmethod
    async def read_head(cls, conn: _Connection, head_only: bool) -> UpstreamResponse:
        while True:
            end = conn.buffer.find(b"\r\n\r\n")
            while end < 0:
                if len(conn.buffer) > _HEAD_LIMIT:
                    raise _Malformed("response head larger than 64 KiB")
                if conn.eof:
                    raise _Malformed(
                        "the backend closed the connection without answering"
                        if not conn.buffer
                        else "the backend closed the connection in the middle of its answer"
                    )
                await conn.fill()
                end = conn.buffer.find(b"\r\n\r\n")
            head = bytes(conn.buffer[:end])
            del conn.buffer[: end + 4]
            status, reason, headers, keep_alive = _parse_head(head)
            if 100 <= status < 200:
                if status == 101:
                    raise _Malformed("the backend switched protocols, which yard does not proxy")
                continue  # 100 Continue, 103 Early Hints: the real answer follows
            return cls(conn, status, reason, headers, keep_alive, head_only)

    def buffered(self) -> bool:
        """Whether more of the body (or its end) has already arrived, so the
        next chunk is available without waiting."""
        return self.complete or bool(self._conn.buffer)

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
        try:
            while not self.complete:
                data = self._take()
                if data:
                    return data
                if self.complete:
                    break
                if self._conn.eof:
                    if self._mode == "close":
                        self.complete = True
                        break
                    raise UpstreamError(
                        "the backend closed the connection before its answer was complete",
                        response_started=True,
                    )
                await self._conn.fill()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise UpstreamError(
                f"connection to the backend broke mid-response: {exc}", response_started=True
            ) from exc
        except _Malformed as exc:
            raise UpstreamError(
                f"the backend's response is malformed: {exc}", response_started=True
            ) from exc
        raise StopAsyncIteration

    def _take(self) -> bytes:
        """Body bytes available in the buffer now (b"" if none yet)."""
        buf = self._conn.buffer
        if not buf:
            return b""
        mode = self._mode
        if mode == "length":
            n = min(self._remaining, len(buf))
            data = bytes(buf[:n])
            del buf[:n]
            self._remaining -= n
            self.complete = self._remaining == 0
            return data
        if mode == "close":
            data = bytes(buf)
            buf.clear()
            return data
        # chunked: gather what is here of as many chunks as are complete.
        out = bytearray()
        while buf:
            if self._chunk_left > 0:
                n = min(self._chunk_left, len(buf))
                out += buf[:n]
                del buf[:n]
                self._chunk_left -= n
                if self._chunk_left == 0:
                    self._chunk_left = -1  # the CRLF after the data is next
                continue
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                if len(buf) > 4096:
                    raise _Malformed("chunk size line too long")
                break
            if self._chunk_left == -1:
                if line_end != 0:
                    raise _Malformed("missing CRLF after chunk data")
                del buf[:2]
                self._chunk_left = 0
                continue
            if self._chunk_left == -2:
                # Trailers: skip header lines up to the empty one.
                del buf[: line_end + 2]
                if line_end == 0:
                    self.complete = True
                    break
                continue
            size_text = bytes(buf[:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise _Malformed(f"bad chunk size {size_text[:20]!r}") from None
            del buf[: line_end + 2]
            if size == 0:
                self._chunk_left = -2
            else:
                self._chunk_left = size
        return bytes(out)

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
