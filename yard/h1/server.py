"""A lean HTTP/1.1 server for yard's ASGI app, on Trio.

Why not hypercorn: the proxy's budget is a fraction of a millisecond per
request, and hypercorn alone spent about 300 µs of CPU per request here (a
task per request, one socket write per ASGI message). This server runs the
app inline in the connection's task and writes a response's head together
with its first body chunk, so a small proxied answer costs one read and one
write on the client side.

What it supports, and nothing more: HTTP/1.1 and 1.0 with keep-alive
(:mod:`yard.h1.wire` does the parsing and framing: h11 did, at four to
seven times the cost), ASGI 3 ``http`` and ``lifespan`` scopes,
``Expect: 100-continue``, ``http.disconnect`` when the client goes away (also
while the response streams), and graceful shutdown. No TLS, HTTP/2 or
websockets: yard listens on loopback or behind a reverse proxy.

Its rooms, one per role:

- this module: the accept loop and its connection cap (:class:`Server`),
  :func:`serve` (the lifecycle);
- :mod:`yard.h1.limits`: :class:`Limits`, what a client may hold;
- :mod:`yard.h1.lobby`: new connections waiting for their first request,
  without a task each (so that a crowd of slow clients costs little);
- :mod:`yard.h1.connection`: one client connection, its requests in turn,
  its time limits and the hang-up watch;
- :mod:`yard.h1.exchange`: one request/response, the ASGI ``receive`` and
  ``send`` (and the ``yard.hold`` and ``yard.disconnect`` extensions);
- :mod:`yard.h1.lifespan`: the ASGI lifespan protocol.

What a client may hold is bounded (:class:`Limits`): time for a head, for a
body's progress, for a write's progress, idle time between requests, and
the number of open connections. Past ``max_connections`` a small reserve
still serves ``GET /healthz`` and requests with the admin key (a head that
is there whole at once, one request per connection); past the reserve a
connection is answered 503 and closed at once, without a task.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from yard.h1 import sockio, wire
from yard.h1.asgi import ASGIApp, Message, Scope
from yard.h1.connection import Connection
from yard.h1.lifespan import run_lifespan
from yard.h1.limits import Limits, connection_cap
from yard.h1.lobby import First, Lobby
from yard.h1.screening import Tally, bearer_matches, refusal

__all__ = [
    "ASGIApp",
    "Limits",
    "Message",
    "Scope",
    "Server",
    "ServerStatistics",
    "connection_cap",
    "open_listeners",
    "serve",
]

log = logging.getLogger("yard.http.server")

_DEFER_ACCEPT_S = 5
# accept() errors that mean "no capacity now, try again" (as trio.serve_listeners).
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_RETRY_S = 0.1
_LOG_EVERY_S = 10.0
_ACCEPT_BATCH = 256
"""Connections taken from a listener's backlog per wake-up, at most. Large:
a connection that waits for its request costs some 25 us here (a few ms
per batch), while a trip through the run loop under load can take 15 ms; at
16 per trip, a crowd opening connections fast (1,000 in 0.3 s) kept up to
500 waiting in the backlog, and a real client behind them for 100-200 ms."""


class _Throttled:
    """A log line at most once per ``every_s``, saying how many were held back."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.next_at = -math.inf
        self.held_back = 0

    def log(self, level: int, message: str, *args: object) -> None:
        now = trio.current_time()
        if now < self.next_at:
            self.held_back += 1
            return
        if self.held_back:
            message += " (and %d more like it in the last %g s)"
            args = (*args, self.held_back, self.every_s)
        log.log(level, message, *args)
        self.next_at = now + self.every_s
        self.held_back = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerStatistics:
    """What :meth:`Server.statistics` reports: the connections now, and what
    the limits have done since the server started.

    open_connections: connections being served (in full or from the reserve).
    waiting_connections: of those, the ones waiting on their client (for a
        request head, or more of a body): the ones the cap may close.
    max_connections: the cap in force (after the open-file limit).
    evicted: connections closed at the cap to make room for a new one.
    refused: connections answered 503 ``too_many_connections``.
    head_timeouts: heads that did not come whole within ``head_timeout_s``.
    idle_closed: keep-alive connections closed after ``keep_alive_s`` idle.
    body_timeouts: bodies that made no progress for ``body_timeout_s`` (408).
    send_timeouts: answers the client took nothing of for ``send_timeout_s``.
    """

    open_connections: int
    waiting_connections: int
    max_connections: int
    evicted: int
    refused: int
    head_timeouts: int
    idle_closed: int
    body_timeouts: int
    send_timeouts: int


class Server:
    """Serves one ASGI app on TCP listeners (see :func:`serve`).

    ``admin_key``: requests that carry it (``Authorization: Bearer``) may use
    the reserved connections, as ``GET /healthz`` may.
    """

    def __init__(
        self, app: ASGIApp, *, limits: Limits | None = None, admin_key: str | None = None
    ) -> None:
        self.app = app
        self.limits = limits = limits or Limits()
        self.max_connections = connection_cap(limits.max_connections, limits.reserved_connections)
        self._admin_key = admin_key.encode() if admin_key else None
        self.closing = False
        self.address: tuple[str, int] | None = None
        self.lifespan_state: dict[str, Any] = {}
        self.connections: set[Connection] = set()
        self.waiting: OrderedDict[Connection, None] = OrderedDict()
        """The connections waiting on their client (for a request head, or
        more of a body), the longest waiting first: the next to close at the
        cap."""
        self.tally = Tally()
        self.nursery: trio.Nursery | None = None
        """Where connections and their hang-up readers run (set by :func:`serve`)."""
        self.accepting = True
        self._accept_scopes: set[trio.CancelScope] = set()
        # Per listener, a duplicate of its socket that accepts without a
        # checkpoint (trio's accept is one trip through the run loop each).
        self._backlogs: dict[trio.SocketListener, socket.socket] = {}
        self.lobby = Lobby(self, self)
        """New connections waiting for their first request, without a task."""
        self._accept_failed = _Throttled(_LOG_EVERY_S)
        self._refused = _Throttled(_LOG_EVERY_S)
        self._evicted = _Throttled(_LOG_EVERY_S)
        self._refusal = refusal(
            "too_many_connections",
            f"yard has {self.max_connections} connections open, its limit "
            "(server.max_connections); retry shortly, or reuse a connection",
            retry_after_s=1.0,
        )

    def statistics(self) -> ServerStatistics:
        """The connections now, and what the limits have done so far."""
        tally = self.tally
        return ServerStatistics(
            open_connections=len(self.connections),
            waiting_connections=len(self.waiting),
            max_connections=self.max_connections,
            evicted=tally.evicted,
            refused=tally.refused,
            head_timeouts=tally.head_timeouts,
            idle_closed=tally.idle_closed,
            body_timeouts=tally.body_timeouts,
            send_timeouts=tally.send_timeouts,
        )

    def may_use_reserve(self, request: wire.Request) -> bool:
        """Whether a request on a connection over the cap is served:
        ``GET /healthz``, or one with the admin key."""
        if request.method in (b"GET", b"HEAD") and request.target.partition(b"?")[0] == b"/healthz":
            return True
        return self._admin_key is not None and bearer_matches(request.headers, self._admin_key)

    def _make_room(self) -> bool:
        """At the cap: close the connection that has waited longest on its
        client (for a request head, idle between requests, or for more of a
        body, also after its answer), so that one whose request is here
        (TCP_DEFER_ACCEPT) is served instead. False when no connection waits
        on its client."""
        if not self.waiting:
            return False
        oldest, _ = self.waiting.popitem(last=False)
        self.tally.evicted += 1
        if not self.lobby.evict(oldest):
            oldest.evict()
        self._evicted.log(
            logging.WARNING,
            "at server.max_connections (%d): closed the connection waiting longest for a "
            "request to serve a new one",
            self.max_connections,
        )
        return True

    def close_idle(self) -> None:
        """At shutdown: close connections waiting for their next request
        (or their first)."""
        self.lobby.close()
        for conn in list(self.connections):
            if conn.idle_since is not None:
                conn.stream.socket.close()
                conn.hang_up()

    async def handle(self, stream: trio.SocketStream, *, restricted: bool = False) -> None:
        """Serve one accepted connection until it ends (``restricted``: from
        the reserve, see :class:`~yard.h1.connection.Connection`)."""
        try:
            peer = stream.socket.getpeername()
            client: tuple[str, int] | None = (str(peer[0]), int(peer[1]))
        except (OSError, IndexError, TypeError, ValueError):
            client = None  # (not an IP socket)
        try:
            await Connection(self, stream, client, restricted=restricted).serve()
        except Exception:
            # One broken connection must never take the server down with it.
            log.exception("connection from %s failed", client)
        finally:
            stream.socket.close()

    def _refuse(self, stream: trio.SocketStream) -> None:
        """Answer 503 and close, at once and without waiting: over the cap
        and the reserve, a connection must not cost a task."""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            # The request's bytes (there already: TCP_DEFER_ACCEPT) are read,
            # so that closing sends the answer rather than a reset.
            sockio.read_now(stream, 65536)
            os.write(stream.socket.fileno(), self._refusal)
        stream.socket.close()
        self.tally.refused += 1
        self._refused.log(
            logging.WARNING,
            "refused a connection: %d open, the limit (server.max_connections) plus %d reserved",
            len(self.connections),
            self.limits.reserved_connections,
        )

    def _admit(self, stream: trio.SocketStream) -> bool | None:
        """Whether a new connection is served from the reserve (True) or in
        full (False); None when it was refused (and closed)."""
        open_now = len(self.connections)
        if open_now < self.max_connections or self._make_room():
            return False
        if open_now < self.max_connections + self.limits.reserved_connections:
            return True
        self._refuse(stream)
        return None

    def _arrive(
        self, stream: trio.SocketStream, peer: Any = None
    ) -> tuple[Connection, First | None] | None:
        """Admit a new connection (it counts against the cap from now on):
        what its task is to start with, or None when it was refused, waits
        in the lobby for its request, or is gone. ``peer``: its address,
        when accept gave it."""
        restricted = self._admit(stream)
        if restricted is None:
            return None
        try:
            if peer is None:
                peer = stream.socket.getpeername()
            client: tuple[str, int] | None = (str(peer[0]), int(peer[1]))
        except (OSError, IndexError, TypeError, ValueError):
            client = None  # (not an IP socket)
        conn = Connection(self, stream, client, restricted=restricted)
        self.connections.add(conn)
        if restricted:
            return conn, None  # (it takes only what is there: no waiting)
        first = self.lobby.arrive(conn)
        return None if first is None else (conn, first)

    def admit(self, stream: trio.SocketStream) -> None:
        """Take a new connection as the accept loop does: it counts against
        the cap at once (or is refused), and gets a task of its own once its
        first request is in (at once, usually; see
        :class:`~yard.h1.lobby.Lobby`)."""
        ready = self._arrive(stream)
        if ready is not None:
            self.start(*ready)

    def start(self, conn: Connection, first: First | None) -> None:
        """Serve ``conn`` (admitted) in a task of its own."""
        assert self.nursery is not None
        self.nursery.start_soon(self._serve, conn, first)

    async def _serve(self, conn: Connection, first: First | None) -> None:
        try:
            await conn.serve(first)
        except Exception:
            # One broken connection must never take the server down with it.
            log.exception("connection from %s failed", conn.client)
        finally:
            self.connections.discard(conn)
            conn.stream.socket.close()

    def _accept_now(self, listener: trio.SocketListener) -> list[tuple[trio.SocketStream, Any]]:
        """The connections waiting in ``listener``'s backlog now, up to
        :data:`_ACCEPT_BATCH` - 1, taken without waiting or a checkpoint,
        with their peers' addresses."""
        if not self.accepting or listener.socket.fileno() < 0:
            return []
        backlog = self._backlogs.get(listener)
        if backlog is None:
            sock = listener.socket
            backlog = socket.fromfd(sock.fileno(), sock.family, sock.type, sock.proto)
            backlog.setblocking(False)
            self._backlogs[listener] = backlog
        streams: list[tuple[trio.SocketStream, Any]] = []
        for _ in range(_ACCEPT_BATCH - 1):
            try:
                accepted, peer = backlog.accept()
            except OSError:
                # Nothing waiting (EAGAIN), or an error the waiting accept
                # meets and handles next.
                break
            streams.append((trio.SocketStream(trio.socket.from_stdlib_socket(accepted)), peer))
        return streams

    async def accept_and_serve(self, listener: trio.SocketListener) -> None:
        """Accept connections, hand the listener to a new task, serve one.

        Leader and followers instead of one accepting task that starts a task
        per connection: the task that was woken by the connection serves it
        straight away, and the next acceptor starts while this one waits on
        a backend. A task started per connection would only run after one
        more trip through the run loop, between the accept and the request.

        What else waits in the backlog when the task wakes (up to
        :data:`_ACCEPT_BATCH` connections in all) is taken at once, each
        into a task of its own: one connection per trip through the run
        loop would keep a client waiting in the backlog behind a crowd (an
        attacker's reconnecting sockets) for as many trips.

        A connection whose request is not in yet gets no task: it waits in
        the :class:`~yard.h1.lobby.Lobby`, and this task goes on
        accepting.
        """
        assert self.nursery is not None
        handed_over = False
        try:
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
                    self._accept_failed.log(
                        logging.ERROR,
                        "accept failed (%s); retrying every %.1f s",
                        exc,
                        _ACCEPT_RETRY_S,
                    )
                    await trio.sleep(_ACCEPT_RETRY_S)
                    continue
                finally:
                    self._accept_scopes.discard(scope)
                if scope.cancelled_caught:
                    return
                mine = self._arrive(stream)
                for extra, peer in self._accept_now(listener):
                    ready = self._arrive(extra, peer)
                    if ready is None:
                        continue
                    if mine is None:
                        mine = ready
                    else:
                        self.start(*ready)
                if mine is not None:
                    break
            self.nursery.start_soon(self.accept_and_serve, listener)
            handed_over = True
        finally:
            if not handed_over:
                backlog = self._backlogs.pop(listener, None)
                if backlog is not None:
                    backlog.close()
        await self._serve(*mine)

    def stop_accepting(self, listeners: list[trio.SocketListener]) -> None:
        """No new connections: stop the waiting acceptors, close the listeners."""
        self.accepting = False
        for scope in list(self._accept_scopes):
            scope.cancel()
        for listener in listeners:
            listener.socket.close()


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
    limits: Limits | None = None,
    admin_key: str | None = None,
    listeners: list[trio.SocketListener] | None = None,
    on_server: Callable[[Server], None] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until cancelled or ``shutdown_trigger`` returns.

    ``listeners``: sockets already bound with :func:`open_listeners` (then
    ``host`` and ``port`` are not used), so that a caller can claim the port
    before it starts anything else. ``limits``: what a client may hold (the
    defaults of :class:`Limits` if None); ``admin_key``: requests with it may
    use the reserved connections. ``on_server``: called with the
    :class:`Server` before it starts (to read its :meth:`Server.statistics`,
    for ``/metrics``).

    Runs the app's lifespan startup first (a failure raises ``RuntimeError``),
    then binds and reports the bound addresses (``["http://127.0.0.1:8080"]``;
    port 0 picks a free one) through ``task_status``. On shutdown it stops
    accepting, lets in-flight requests finish for up to ``graceful_s``
    seconds, cancels the rest, then runs the lifespan shutdown. There is no
    response timeout: a stream lasts as long as the app sends (and its
    client reads).
    """
    server = Server(app, limits=limits, admin_key=admin_key)
    if on_server is not None:
        on_server(server)
    if server.max_connections < server.limits.max_connections:
        log.warning(
            "serving at most %d connections (server.max_connections is %d, but the open-file "
            "limit allows no more); raise it with `ulimit -n` to serve more",
            server.max_connections,
            server.limits.max_connections,
        )
    started, stop, stopped = trio.Event(), trio.Event(), trio.Event()
    failure: list[str] = []
    async with trio.open_nursery() as lifespan_nursery:
        lifespan_nursery.start_soon(
            run_lifespan, app, server.lifespan_state, started, stop, stopped, failure
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
