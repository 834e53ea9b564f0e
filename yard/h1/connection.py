"""One client connection of yard's HTTP/1.1 server: its requests in turn.

The rules a connection keeps:

- **Every wait on the client has a limit** (:class:`yard.h1.limits.Limits`):
  a new connection's first request head must be in within
  ``head_timeout_s``; between requests the connection may stay idle for
  ``keep_alive_s``, and once a head's first byte is there the rest of it
  must follow within ``head_timeout_s`` (a head that trickles in gets no
  more time per byte); a request body that makes no progress for
  ``body_timeout_s`` is answered 408; a write the client takes nothing of
  for ``send_timeout_s`` ends the exchange the way a hang-up does. The app's
  own time is not limited: a stream lasts as long as the app sends.
- **Limits cost nothing when nobody waits.** A read or write the kernel
  answers at once runs without a cancel scope; the deadline is put only
  around the part that waits (:func:`yard.h1.sockio.receive_now`).
- **Bad requests get a JSON answer**, in the OpenAI error shape, with a
  stable ``code`` (``malformed_request``, ``request_timeout``, ...), then
  the connection closes; never the 500 of an app that saw its client go.
- **A hang-up is seen at once**, also while the app works (see
  :class:`Connection`).
- **The reserve cannot be held by slow heads.** A connection accepted over
  the server's cap takes only a head that is there whole at once, and
  serves one request (``/healthz`` or the admin key's), then closes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import OrderedDict
from typing import Any, Protocol
from urllib.parse import unquote

import trio

from yard.h1 import sockio, wire
from yard.h1.asgi import ASGIApp, ResponseCut, Scope
from yard.h1.errors import error_body, error_headers
from yard.h1.exchange import Exchange, protocol_failure
from yard.h1.limits import Limits
from yard.h1.screening import (
    CLOSE,
    Tally,
    body_timeout_message,
    head_timeout_message,
    small_content_length,
)

log = logging.getLogger("yard.http.server")

_READ = 65536
_MAX_HEAD = 64 * 1024
_DRAIN_LIMIT = 16 * 2**20
_DRAIN_S = 1.0
_PIPELINE_LIMIT = 1 * 2**20


class Host(Protocol):
    """What a connection needs of its server (:class:`yard.h1.server.Server`)."""

    app: ASGIApp
    limits: Limits
    closing: bool
    address: tuple[str, int] | None
    lifespan_state: dict[str, Any]
    connections: set[Connection]
    waiting: OrderedDict[Connection, None]
    """The connections waiting on their client, the longest waiting first."""
    tally: Tally
    nursery: trio.Nursery | None
    max_connections: int

    def may_use_reserve(self, request: wire.Request) -> bool: ...


class Connection:
    """One client connection: requests in turn, each handed to the app.

    The connection's task reads the requests. While the app works on a
    request whose body is in, a reader task (one per connection, not per
    request; started with the first request's body, in the server's nursery)
    watches the socket, so that a client hanging up is seen at once
    (``http.disconnect``, and the cancel scope the app asked to have
    cancelled through the ``yard.disconnect`` extension); when the response
    is complete its wait is cancelled (trio delivers that at once, and the
    reader holds no bytes across it) and the connection's task reads the
    next request itself.

    ``restricted``: accepted over the server's connection cap, into its
    reserve: only ``GET /healthz`` and requests with the admin key are
    served (one, then the connection closes); others get 503.
    """

    def __init__(
        self,
        server: Host,
        stream: trio.SocketStream,
        client: tuple[str, int] | None,
        *,
        restricted: bool = False,
    ) -> None:
        self.server = server
        self.stream = stream
        self.client = client
        self.restricted = restricted
        self.wire = wire.ServerConnection(max_head=_MAX_HEAD)
        self.gone = False
        self.gone_event = trio.Event()
        self.idle_since: float | None = None
        """Set while waiting for a request none of which has arrived yet
        (such a connection is closed at once at shutdown)."""
        # While waiting on the client for a request's head (none of it, or
        # part) or for more of its body (also the rest of a body the app
        # answered without reading), the connection is in server.waiting:
        # the server may close it to make room at its cap, the longest
        # waiting first. A connection is added when its wait begins and
        # removed when it ends, so the order is that of the waits' beginnings.
        self._waiting = server.waiting
        limits = server.limits
        self._keep_alive_s = limits.keep_alive_s
        self._head_timeout_s = limits.head_timeout_s
        self.body_timeout_s = limits.body_timeout_s
        self._send_timeout_s = limits.send_timeout_s
        self._requests = 0
        self._may_read = trio.Event()
        self._read_scope: trio.CancelScope | None = None
        self._pipelined = 0
        self._watched: trio.CancelScope | None = None
        self._reader_scope = trio.CancelScope()
        self._reader_started = False

    # -- the yard.disconnect extension ---------------------------------------

    def watch(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` if the client goes away before :meth:`unwatch`."""
        self._watched = scope
        if self.gone:
            scope.cancel()

    def unwatch(self) -> None:
        self._watched = None

    def hang_up(self) -> None:
        """The client is gone (or treated as gone): writes become no-ops and
        the watched scope is cancelled."""
        self.gone = True
        self.gone_event.set()
        if self._watched is not None:
            self._watched.cancel()

    # -- the hang-up watch -----------------------------------------------------

    async def _run_reader(self) -> None:
        with self._reader_scope:
            try:
                await self._reader()
            except Exception:
                # In the server's nursery: a failure here must not end the
                # server. The connection's task sees the client as gone.
                log.exception("watching the connection from %s failed", self.client)
                self.hang_up()

    async def _reader(self) -> None:
        stream = self.stream
        while True:
            await self._may_read.wait()
            watching = self._may_read
            if not watching.is_set():
                # Stopped again before this task ran (the app answered
                # without a checkpoint): the connection's task reads now.
                continue
            # Wait, then read in the same step as the check that watching is
            # still on: this task never holds bytes across a checkpoint, so
            # once stop_watching returns nothing more is taken from the
            # socket and the connection's task can read at once.
            with trio.CancelScope() as scope:
                self._read_scope = scope
                # (Closed by the server: the read below says so.)
                with contextlib.suppress(trio.ClosedResourceError, OSError):
                    await trio.lowlevel.wait_readable(stream.socket)
            self._read_scope = None
            if scope.cancel_called or self._may_read is not watching:
                continue
            try:
                data = sockio.read_now(stream, _READ)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if data is None:
                continue  # a spurious wake-up
            if not data:
                self.hang_up()
                return
            # Bytes after the body (a pipelined request, or the next one sent
            # the moment the response arrived) wait in the parser's buffer;
            # past a limit stop reading (and watching).
            self.wire.receive_data(data)
            self._pipelined += len(data)
            if self._pipelined > _PIPELINE_LIMIT:
                self._may_read = trio.Event()

    def start_watching(self) -> None:
        """The request's body is in: keep reading, to see a hang-up at once."""
        self._pipelined = 0
        self._may_read.set()
        if not self._reader_started and self.server.nursery is not None:
            # Started at the first request's end, not when the connection
            # opens: its first steps then run while the app waits on its
            # backend, not before the request is even parsed.
            self._reader_started = True
            self.server.nursery.start_soon(self._run_reader)

    def stop_watching(self) -> None:
        self._watched = None
        if self._may_read.is_set():
            self._may_read = trio.Event()
        if self._read_scope is not None:
            # Delivered at once to a task blocked in a read: the socket is
            # free for the connection's task when this returns.
            self._read_scope.cancel()

    # -- reading ---------------------------------------------------------------

    async def _receive(self, deadline: float) -> bool:
        """Read more of the request into the parser (its end of file when the
        client is gone); False when nothing came by ``deadline``."""
        if not self.gone:
            try:
                data = sockio.receive_now(self.stream, _READ)
                if data is None:
                    with trio.move_on_at(deadline):
                        data = await self.stream.receive_some(_READ)
                    if data is None:
                        return False
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if data:
                self.wire.receive_data(data)
                return True
            self.hang_up()
        self.wire.receive_data(b"")
        return True

    def _take_waiting(self) -> None:
        """Read into the parser what the client has sent so far, without
        waiting."""
        try:
            while data := sockio.read_now(self.stream, _READ):
                self.wire.receive_data(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if data is not None:
            self.hang_up()
            self.wire.receive_data(b"")

    async def _next_request(self) -> wire.Event | wire.Signal | None:
        """The next request's head (or what ends the connection); None when
        it did not come in time."""
        conn = self.wire
        if self.restricted:
            # From the reserve: only a head that is here whole at once (it
            # was when the connection was accepted, TCP_DEFER_ACCEPT), so
            # that heads that trickle in cannot hold the reserve.
            self._take_waiting()
            event = conn.next_event()
            return None if event is wire.NEED_DATA else event
        event = conn.next_event()
        if event is not wire.NEED_DATA:
            return event  # pipelined, already here
        now = trio.current_time()
        if conn.buffered or not self._requests:
            deadline = now + self._head_timeout_s
        else:
            deadline = now + self._keep_alive_s
        self.idle_since = None if conn.buffered else now
        self._waiting[self] = None
        try:
            while True:
                if not await self._receive(deadline):
                    return None
                event = conn.next_event()
                if event is not wire.NEED_DATA:
                    self.idle_since = None
                    return event
                if self.idle_since is not None and conn.buffered:
                    # A head has begun: it has head_timeout_s from its first byte.
                    self.idle_since = None
                    if self._requests:
                        deadline = trio.current_time() + self._head_timeout_s
        finally:
            self._waiting.pop(self, None)

    async def body_event(self) -> wire.Event | wire.Signal | None:
        """The request body's next event; None when the body made no
        progress for ``body_timeout_s``.

        Raises:
            wire.ProtocolError: a malformed body.
        """
        while True:
            event = self.wire.next_event()
            if event is not wire.NEED_DATA:
                return event
            self._waiting[self] = None
            try:
                if not await self._receive(trio.current_time() + self.body_timeout_s):
                    self.server.tally.body_timeouts += 1
                    return None
            finally:
                self._waiting.pop(self, None)

    async def _wait_small_body(self, request: wire.Request) -> bool:
        """Wait until a small body (a Content-Length up to 64 KiB) is all
        here before the app sees its request: a head whose body never comes
        (a slow or abusive client's) then costs the app nothing, and its wait
        is one the server may end to make room at its cap. Usually the body
        came with the head and nothing waits. Not for ``Expect:
        100-continue`` (its client waits for the app's go-ahead), chunked or
        larger bodies, nor on the reserve. False when the connection ends
        (408 sent, or the client left)."""
        conn = self.wire
        if self.restricted or conn.they_are_waiting_for_100_continue:
            return True
        length = small_content_length(request.headers)
        if length is None or conn.buffered >= length:
            return True
        self._waiting[self] = None
        try:
            while conn.buffered < length and not self.gone:
                if not await self._receive(trio.current_time() + self.body_timeout_s):
                    self.server.tally.body_timeouts += 1
                    await self.error(
                        408, "request_timeout", body_timeout_message(self.server.limits)
                    )
                    return False
        finally:
            self._waiting.pop(self, None)
        return not self.gone

    async def _drain_request(self) -> bool:
        """Read what the app left of the request body, so the connection can
        be reused (or give up and close it when there is too much)."""
        drained = 0
        deadline = trio.current_time() + _DRAIN_S
        while self.wire.their_state is wire.SEND_BODY:
            try:
                event = self.wire.next_event()
                if event is wire.NEED_DATA:
                    # The answer is out: nothing is lost if the server closes
                    # this connection to make room.
                    self._waiting[self] = None
                    try:
                        if not await self._receive(deadline):
                            return False
                    finally:
                        self._waiting.pop(self, None)
                    continue
            except wire.ProtocolError:
                return False
            if isinstance(event, wire.Data):
                drained += len(event.data)
                if drained > _DRAIN_LIMIT:
                    return False
            elif not isinstance(event, wire.EndOfMessage):
                return False
        return self.wire.their_state is wire.DONE

    # -- writing ---------------------------------------------------------------

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the client. A client that went away makes writes
        no-ops (as in hypercorn; the app learns of it from
        ``http.disconnect``); one that takes nothing for ``send_timeout_s``
        is treated as gone."""
        if not data or self.gone:
            return
        try:
            await sockio.send_all(self.stream, data, stall_s=self._send_timeout_s)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.hang_up()
        except trio.TooSlowError:
            self.server.tally.send_timeouts += 1
            log.info(
                "%s read nothing of its answer for %g s (server.send_timeout_s): cut",
                self.client,
                self._send_timeout_s,
            )
            self.hang_up()

    def _error_bytes(
        self, status: int, code: str, message: str, retry_after_s: float | None
    ) -> bytes | None:
        if self.wire.our_state not in (wire.IDLE, wire.SEND_RESPONSE):
            return None
        body = error_body(status, code, message)
        try:
            data = self.wire.response_head(status, [*error_headers(body, retry_after_s), CLOSE])
            return data + self.wire.body(body) + self.wire.end()
        except wire.LocalProtocolError:
            return None

    async def error(
        self, status: int, code: str, message: str, retry_after_s: float | None = None
    ) -> None:
        """Answer with a JSON error and ``connection: close`` (if no response
        has begun)."""
        data = self._error_bytes(status, code, message, retry_after_s)
        if data is not None:
            await self.write(data)

    def error_now(self, status: int, code: str, message: str) -> None:
        """As :meth:`error`, without waiting: what the socket takes at once
        (all of it, on a connection that has been sent nothing yet); the
        caller closes the connection."""
        data = self._error_bytes(status, code, message, None)
        if data is None or self.gone:
            return
        with contextlib.suppress(OSError, ValueError):
            os.write(self.stream.socket.fileno(), data)

    async def _refuse(self) -> None:
        self.server.tally.refused += 1
        await self.error(
            503,
            "too_many_connections",
            f"yard has {self.server.max_connections} connections open, its limit "
            "(server.max_connections); retry shortly, or reuse a connection",
            retry_after_s=1.0,
        )

    # -- the requests ------------------------------------------------------------

    def evict(self) -> None:
        """Close the connection now (the server's cap needs its room); its
        task sees the client as gone."""
        self.stream.socket.close()
        self.hang_up()

    async def serve(
        self, first: wire.Event | wire.Signal | wire.ProtocolError | None = None
    ) -> None:
        """Serve requests until the client leaves, a limit ends the
        connection, or the server closes.

        ``first``: what the parser gave first when that was read before the
        task started (see :class:`yard.h1.lobby.Lobby`): the first
        request's head (with its small body read), or the error of a
        malformed one; it is served also if the server is closing by now."""
        try:
            await self._serve_requests(first)
        finally:
            # The reader lives in the server's nursery, not in one of this
            # connection's own: leaving a nursery costs a trip through the run
            # loop, typically while the same client's next connection waits
            # to be accepted. It is cancelled here and unwinds on its own.
            self._reader_scope.cancel()
            self.server.connections.discard(self)
            self.stream.socket.close()

    async def _serve_requests(
        self, first: wire.Event | wire.Signal | wire.ProtocolError | None
    ) -> None:
        server = self.server
        server.connections.add(self)
        while first is not None or not server.closing:
            try:
                if first is None:
                    event = await self._next_request()
                elif isinstance(first, wire.ProtocolError):
                    raise first
                else:
                    event, first = first, None
            except wire.ProtocolError as exc:
                await self.error(*protocol_failure(exc))
                return
            if event is None:
                if self.restricted:
                    await self._refuse()
                elif self.wire.buffered:
                    server.tally.head_timeouts += 1
                    await self.error(408, "request_timeout", head_timeout_message(server.limits))
                elif self._requests:
                    server.tally.idle_closed += 1  # (keep_alive_s)
                else:
                    server.tally.head_timeouts += 1  # (not a byte of it)
                return
            if not isinstance(event, wire.Request):
                return  # ConnectionClosed
            self._requests += 1
            if self.restricted and not server.may_use_reserve(event):
                await self._refuse()
                return
            if not await self._wait_small_body(event):
                return
            try:
                keep = await self._request(event)
            finally:
                self.stop_watching()
            if (
                not keep
                or self.gone
                or self.restricted
                or self.wire.our_state is not wire.DONE
                or not await self._drain_request()
            ):
                return
            self.wire.start_next_cycle()

    async def _request(self, request: wire.Request) -> bool:
        """Run the app on one request; False if the connection must close."""
        raw_path, _, query = request.target.partition(b"?")
        server = self.server
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode(),
            "method": request.method.decode(),
            "scheme": "http",
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": request.headers,
            "client": self.client,
            "server": server.address,
            "state": dict(server.lifespan_state),
            "extensions": {"yard.hold": {}, "yard.disconnect": self},
        }
        exchange = Exchange(self, request.method == b"HEAD")
        try:
            await server.app(scope, exchange.receive, exchange.send)
        except Exception as exc:
            cut = _only_cut(exc)
            if cut is not None:
                log.warning("%s %s ended short: %s", scope["method"], scope["path"], cut)
                if not exchange.started:
                    await self.error(500, "internal_error", str(cut))
                return False
            log.exception("error while serving %s %s", scope["method"], scope["path"])
            if not exchange.started:
                await self.error(500, "internal_error", "yard failed on this request (see its log)")
            return False
        failure = exchange.failure
        if failure is not None:
            # The request itself was at fault (malformed or too slow body):
            # the app saw the client go; the client hears why.
            if not exchange.started:
                await self.error(*failure)
            return False
        if not exchange.started:
            await self.error(500, "internal_error", "the application sent no response")
        elif exchange.held is not None:
            await self.write(exchange.held)
        return True


def _only_cut(exc: Exception) -> ResponseCut | None:
    """The :class:`ResponseCut` that ``exc`` is, or is all of (an app's nursery
    wraps what its tasks raise in a group); None if anything else went wrong."""
    if isinstance(exc, ResponseCut):
        return exc
    if isinstance(exc, ExceptionGroup):
        cuts, rest = exc.split(ResponseCut)
        if cuts is not None and rest is None:
            return _only_cut(cuts.exceptions[0])
    return None
