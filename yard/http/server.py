"""A lean HTTP/1.1 server for yard's ASGI app, on Trio.

Why not hypercorn: the proxy's budget is a fraction of a millisecond per
request, and hypercorn alone spent about 300 µs of CPU per request here (a
task per request, one socket write per ASGI message). This server runs the
app inline in the connection's task and writes a response's head together
with its first body chunk, so a small proxied answer costs one read and one
write on the client side.

What it supports, and nothing more: HTTP/1.1 and 1.0 with keep-alive
(:mod:`yard.http.wire` does the parsing and framing: h11 did, at four to
seven times the cost), ASGI 3 ``http`` and ``lifespan`` scopes,
``Expect: 100-continue``, ``http.disconnect`` when the client goes away (also
while the response streams), and graceful shutdown. No TLS, HTTP/2 or
websockets: yard listens on loopback or behind a reverse proxy.

Extensions (in ``scope["extensions"]``):

- ``yard.hold``: a ``http.response.start`` message with ``"yard.hold": True``
  asks the server to hold the head back until the next body message (the
  sender promises one follows at once); without it the head is written at
  once, so streams show their headers without waiting for a first chunk.
- ``yard.disconnect``: an object with ``watch(cancel_scope)`` and
  ``unwatch()``: the server cancels the watched scope the moment the client
  goes away, so the app needs no task of its own to watch for
  ``http.disconnect``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

import trio

from yard.http import sockio, wire

log = logging.getLogger("yard.http.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]

_READ = 65536
_MAX_HEAD = 64 * 1024
_DRAIN_LIMIT = 16 * 2**20
_PIPELINE_LIMIT = 1 * 2**20
_DEFER_ACCEPT_S = 5
_ERROR_HEAD = [(b"content-type", b"text/plain"), (b"connection", b"close")]
# accept() errors that mean "no capacity now, try again" (as trio.serve_listeners).
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_RETRY_S = 0.1


class _Connection:
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
    """

    def __init__(
        self, server: Server, stream: trio.SocketStream, client: tuple[str, int] | None
    ) -> None:
        self.server = server
        self.stream = stream
        self.client = client
        self.wire = wire.ServerConnection(max_head=_MAX_HEAD)
        self.gone = False
        self.gone_event = trio.Event()
        self.idle_since: float | None = None
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

    # -- reading ---------------------------------------------------------------

    async def _run_reader(self) -> None:
        with self._reader_scope:
            try:
                await self._reader()
            except Exception:
                # In the server's nursery: a failure here must not end the
                # server. The connection's task sees the client as gone.
                log.exception("watching the connection from %s failed", self.client)
                self._hang_up()

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
            # socket and the connection's task can read at once (bytes taken
            # while holding them across Trio's post-read checkpoint were a
            # lost request: the next one, sent the moment the answer arrived).
            with trio.CancelScope() as scope:
                self._read_scope = scope
                # (Closed by the reaper: the read below says so.)
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
                self._hang_up()
                return
            # Bytes after the body (a pipelined request, or the next one sent
            # the moment the response arrived) wait in the parser's buffer;
            # past a limit stop reading (and watching).
            self.wire.receive_data(data)
            self._pipelined += len(data)
            if self._pipelined > _PIPELINE_LIMIT:
                self._may_read = trio.Event()

    def _hang_up(self) -> None:
        self.gone = True
        self.gone_event.set()
        if self._watched is not None:
            self._watched.cancel()

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

    async def next_event(self) -> wire.Event | wire.Signal:
        while True:
            event = self.wire.next_event()
            if event is wire.NEED_DATA:
                if not self.gone:
                    try:
                        data = await sockio.receive_some(self.stream, _READ)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        data = b""
                    if data:
                        self.wire.receive_data(data)
                        continue
                    self._hang_up()
                self.wire.receive_data(b"")
                continue
            return event

    async def write(self, data: bytes) -> None:
        # A client that went away makes writes no-ops (as in hypercorn); the
        # app learns of it from http.disconnect.
        if not data or self.gone:
            return
        try:
            await sockio.send_all(self.stream, data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._hang_up()

    async def serve(self) -> None:
        try:
            await self._serve_requests()
        finally:
            # The reader lives in the server's nursery, not in one of this
            # connection's own: leaving a nursery costs a trip through the run
            # loop (two with a child to wait for), typically while the same
            # client's next connection waits to be accepted. It is cancelled
            # here and unwinds on its own. (Not aclose either, for the same
            # reason: its checkpoint.)
            self._reader_scope.cancel()
            self.server.connections.discard(self)
            self.stream.socket.close()

    async def _serve_requests(self) -> None:
        server = self.server
        server.connections.add(self)
        while not server.closing:
            # The server's reaper closes connections idle past keep_alive_s
            # (one timer for all of them, not a cancel scope per request).
            self.idle_since = trio.current_time()
            try:
                event = await self.next_event()
            except wire.ProtocolError as exc:
                await self._simple_error(exc.status_hint, str(exc))
                return
            self.idle_since = None
            if not isinstance(event, wire.Request):
                return  # ConnectionClosed, or the client sent garbage
            try:
                await self._request(event)
            finally:
                self.stop_watching()
            if self.gone or self.wire.our_state is not wire.DONE or not await self._drain_request():
                return
            self.wire.start_next_cycle()

    async def _drain_request(self) -> bool:
        """Read what the app left of the request body, so the connection can
        be reused (or give up and close it when there is too much)."""
        drained = 0
        while self.wire.their_state is wire.SEND_BODY:
            try:
                with trio.move_on_after(1.0) as late:
                    event = await self.next_event()
            except wire.ProtocolError:
                return False
            if late.cancelled_caught:
                return False
            if isinstance(event, wire.Data):
                drained += len(event.data)
                if drained > _DRAIN_LIMIT:
                    return False
            elif not isinstance(event, wire.EndOfMessage):
                return False
        return self.wire.their_state is wire.DONE

    async def _simple_error(self, status: int, text: str) -> None:
        if self.wire.our_state not in (wire.IDLE, wire.SEND_RESPONSE):
            return
        body = text.encode("utf-8", "replace")
        try:
            data = self.wire.response_head(
                status, [*_ERROR_HEAD, (b"content-length", b"%d" % len(body))]
            )
            data += self.wire.body(body) + self.wire.end()
        except wire.LocalProtocolError:
            return
        await self.write(data)

    async def _request(self, request: wire.Request) -> None:
        raw_path, _, query = request.target.partition(b"?")
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
            "server": self.server.address,
            "state": dict(self.server.lifespan_state),
            "extensions": {"yard.hold": {}, "yard.disconnect": self},
        }
        exchange = _Exchange(self, request.method == b"HEAD")
        try:
            await self.server.app(scope, exchange.receive, exchange.send)
        except Exception:
            log.exception("error while serving %s %s", scope["method"], scope["path"])
            if not exchange.started:
                await self._simple_error(500, "internal server error")
            return
        if not exchange.started:
            await self._simple_error(500, "the application sent no response")
        elif exchange.held is not None:
            await self.write(exchange.held)


class _Exchange:
    """One request/response on a connection: the ASGI receive and send."""

    __slots__ = ("body_done", "conn", "head_only", "held", "started")

    def __init__(self, conn: _Connection, head_only: bool) -> None:
        self.conn = conn
        self.head_only = head_only
        self.body_done = False
        self.started = False
        self.held: bytes | None = None

    async def receive(self) -> Message:
        conn = self.conn
        if not self.body_done:
            if conn.wire.they_are_waiting_for_100_continue:
                await conn.write(conn.wire.informational_100())
            try:
                event = await conn.next_event()
            except wire.ProtocolError:
                self.body_done = True
                return {"type": "http.disconnect"}
            if isinstance(event, wire.Data):
                return {"type": "http.request", "body": event.data, "more_body": True}
            self.body_done = True
            if isinstance(event, wire.EndOfMessage):
                conn.start_watching()
                return {"type": "http.request", "body": b"", "more_body": False}
            conn._hang_up()
            return {"type": "http.disconnect"}
        # The body is in: the next message is the client going away.
        await conn.gone_event.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        conn = self.conn
        if conn.gone:
            return
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            head = conn.wire.response_head(message["status"], list(message.get("headers", ())))
            if message.get("yard.hold"):
                self.held = head
            else:
                await conn.write(head)
        elif kind == "http.response.body":
            if not self.started:
                raise RuntimeError("http.response.body before http.response.start")
            body = message.get("body", b"")
            out = self.held or b""
            self.held = None
            if body and not self.head_only:
                out += conn.wire.body(body)
            if not message.get("more_body", False):
                out += conn.wire.end()
                # Nothing is left to cancel: stop watching for a hang-up
                # before the last write rather than after it, when the
                # client may already be sending its next request.
                conn.stop_watching()
            await conn.write(out)
        else:
            raise RuntimeError(f"unsupported ASGI message {kind!r}")


class Server:
    """Serves one ASGI app on TCP listeners (see :func:`serve`)."""

    def __init__(self, app: ASGIApp, *, keep_alive_s: float = 75.0) -> None:
        self.app = app
        self.keep_alive_s = keep_alive_s
        self.closing = False
        self.address: tuple[str, int] | None = None
        self.lifespan_state: dict[str, Any] = {}
        self.connections: set[_Connection] = set()
        self.nursery: trio.Nursery | None = None
        """Where connections and their hang-up readers run (set by :func:`serve`)."""
        self.accepting = True
        self._accept_scopes: set[trio.CancelScope] = set()

    async def reap_idle(self) -> None:
        """Close keep-alive connections idle for longer than ``keep_alive_s``."""
        while True:
            await trio.sleep(min(5.0, self.keep_alive_s / 2))
            limit = trio.current_time() - self.keep_alive_s
            for conn in list(self.connections):
                if conn.idle_since is not None and conn.idle_since < limit:
                    conn.stream.socket.close()
                    conn._hang_up()

    def close_idle(self) -> None:
        """At shutdown: close connections waiting for their next request."""
        for conn in list(self.connections):
            if conn.idle_since is not None:
                conn.stream.socket.close()
                conn._hang_up()

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            peer = stream.socket.getpeername()
            client: tuple[str, int] | None = (str(peer[0]), int(peer[1]))
        except OSError:
            client = None
        try:
            await _Connection(self, stream, client).serve()
        except Exception:
            # One broken connection must never take the server down with it.
            log.exception("connection from %s failed", client)
        finally:
            stream.socket.close()

    async def accept_and_serve(self, listener: trio.SocketListener) -> None:
        """Accept one connection, hand the listener to a new task, serve it.

        Leader and followers instead of one accepting task that starts a task
        per connection: the task that was woken by the connection serves it
        straight away, and the next acceptor starts while this one waits on
        a backend. A task started per connection would only run after one
        more trip through the run loop, between the accept and the request.
        """
        while True:
            if not self.accepting:
                return
            scope = trio.CancelScope()
            self._accept_scopes.add(scope)
            try:
                with scope:
                    stream = await listener.accept()
            except trio.ClosedResourceError:
                return  # shutting down
            except OSError as exc:
                if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                    raise
                # Out of file descriptors or memory: as trio.serve_listeners.
                log.error("accept failed (%s); retrying in %.1f s", exc, _ACCEPT_RETRY_S)
                await trio.sleep(_ACCEPT_RETRY_S)
                continue
            finally:
                self._accept_scopes.discard(scope)
            if scope.cancelled_caught:
                return
            break
        assert self.nursery is not None
        self.nursery.start_soon(self.accept_and_serve, listener)
        await self.handle(stream)

    def stop_accepting(self, listeners: list[trio.SocketListener]) -> None:
        """No new connections: stop the waiting acceptors, close the listeners."""
        self.accepting = False
        for scope in list(self._accept_scopes):
            scope.cancel()
        for listener in listeners:
            listener.socket.close()


async def _lifespan(
    app: ASGIApp,
    state: dict[str, Any],
    started: trio.Event,
    stop: trio.Event,
    stopped: trio.Event,
    failure: list[str],
) -> None:
    """Run the app's lifespan: startup at once, shutdown once ``stop`` is set."""
    to_app_send, to_app_receive = trio.open_memory_channel[Message](2)
    await to_app_send.send({"type": "lifespan.startup"})

    async def receive() -> Message:
        return await to_app_receive.receive()

    async def send(message: Message) -> None:
        kind = message["type"]
        if kind in ("lifespan.startup.complete", "lifespan.startup.failed"):
            if kind == "lifespan.startup.failed":
                failure.append(str(message.get("message", "")))
            started.set()
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            stopped.set()

    async def shutdown_when_asked() -> None:
        await stop.wait()
        await to_app_send.send({"type": "lifespan.shutdown"})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(shutdown_when_asked)
        try:
            await app(
                {"type": "lifespan", "asgi": {"version": "3.0"}, "state": state}, receive, send
            )
        finally:
            started.set()
            stopped.set()
            nursery.cancel_scope.cancel()


async def open_listeners(host: str, port: int) -> list[trio.SocketListener]:
    """Bind and listen on ``host:port`` (port 0: a free one). Raises ``OSError``
    when the address is taken."""
    listeners = await trio.open_tcp_listeners(port, host=host, backlog=1024)
    for listener in listeners:
        # Wake the accept only once the request's first bytes are there: one
        # wake-up less for every new connection.
        with contextlib.suppress(OSError, AttributeError):
            listener.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, _DEFER_ACCEPT_S)
    return listeners


async def serve(
    app: ASGIApp,
    host: str,
    port: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    graceful_s: float = 10.0,
    keep_alive_s: float = 75.0,
    listeners: list[trio.SocketListener] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until cancelled or ``shutdown_trigger`` returns.

    ``listeners``: sockets already bound with :func:`open_listeners` (then
    ``host`` and ``port`` are not used), so that a caller can claim the port
    before it starts anything else.

    Runs the app's lifespan startup first (a failure raises ``RuntimeError``),
    then binds and reports the bound addresses (``["http://127.0.0.1:8080"]``;
    port 0 picks a free one) through ``task_status``. On shutdown it stops
    accepting, lets in-flight requests finish for up to ``graceful_s``
    seconds, cancels the rest, then runs the lifespan shutdown. There is no
    response timeout: a stream lasts as long as the app sends.
    """
    server = Server(app, keep_alive_s=keep_alive_s)
    started, stop, stopped = trio.Event(), trio.Event(), trio.Event()
    failure: list[str] = []
    async with trio.open_nursery() as lifespan_nursery:
        lifespan_nursery.start_soon(
            _lifespan, app, server.lifespan_state, started, stop, stopped, failure
        )
        await started.wait()
        if failure:
            raise RuntimeError(f"the app failed to start: {failure[0]}")
        try:
            if listeners is None:
                listeners = await open_listeners(host, port)
            sockname = listeners[0].socket.getsockname()
            server.address = (str(sockname[0]), int(sockname[1]))
            shown = f"[{sockname[0]}]" if ":" in str(sockname[0]) else str(sockname[0])
            async with trio.open_nursery() as connections:
                server.nursery = connections
                async with trio.open_nursery() as reaping:
                    reaping.start_soon(server.reap_idle)
                    for listener in listeners:
                        connections.start_soon(server.accept_and_serve, listener)
                    task_status.started([f"http://{shown}:{sockname[1]}"])
                    try:
                        if shutdown_trigger is not None:
                            await shutdown_trigger()
                        else:
                            await trio.sleep_forever()
                    finally:
                        server.stop_accepting(listeners)
                    reaping.cancel_scope.cancel()
                # Graceful: keep-alive connections close after their current
                # request; whatever still runs at the deadline is cancelled.
                server.closing = True
                server.close_idle()
                connections.cancel_scope.deadline = trio.current_time() + graceful_s
        finally:
            stop.set()
            with trio.CancelScope(shield=True) as cleanup:
                cleanup.deadline = trio.current_time() + max(1.0, min(graceful_s, 10.0))
                await stopped.wait()
            lifespan_nursery.cancel_scope.cancel()
