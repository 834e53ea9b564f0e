"""Where a new connection waits, without a task of its own, for its first
request.

A Trio task per connection costs most of a new connection's price: spawning
it, its cancel scopes, trio's registration of its socket, and unwinding it
when the connection ends. A connection that sends its request with its first
bytes (the usual client; the listener's ``TCP_DEFER_ACCEPT`` wakes the
acceptor only once bytes are there) gets its task at once. A connection that
has not sent a whole request head, or whose small body (a Content-Length up
to 64 KiB, which the server reads whole before the app sees the request) is
not all there, waits here instead: its socket is registered in one epoll set
of the lobby's own, and one task waits on that set for all of them. A slow
or abusive client (a slowloris head, a login head whose body never comes)
then costs a few system calls per byte it sends and per eviction, not a
trip of a task through the run loop, so a crowd of them cannot keep a real
request waiting behind it.

The lobby keeps the server's rules for these waits (see
:mod:`yard.h1.connection`): the head must be in within ``head_timeout_s``
of the connection's start (408 when some of it came, a plain close when
none did), a small body may go ``body_timeout_s`` without progress (408),
and a waiting connection is one the server may close at its cap, the
longest waiting first (it is in the server's ``waiting`` from the start of
each wait). A client that leaves is closed without a word, as the task
would.

Linux only (``select.epoll``), as yard is.
"""

from __future__ import annotations

import contextlib
import select
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

import trio

from yard.h1 import sockio, wire
from yard.h1.screening import body_timeout_message, head_timeout_message, small_content_length

if TYPE_CHECKING:
    from yard.h1.connection import Connection, Host

__all__ = ["First", "Lobby"]

First = wire.Event | wire.Signal | wire.ProtocolError
"""What a connection's task starts with: the first request's head (its small
body read), what else the parser said first, or the malformed request's
error."""

_READ = 65536
_BATCH = 256
"""Sockets handled (ready ones, or timed-out ones) per trip through the run
loop, at most: a crowd does not keep other tasks from running."""


class _Starter(Protocol):
    def start(self, conn: Connection, first: First) -> None: ...


class _Guest:
    """A connection waiting in the lobby."""

    __slots__ = ("conn", "deadline", "fd", "length", "request")

    def __init__(self, conn: Connection, fd: int, deadline: float) -> None:
        self.conn = conn
        self.fd = fd
        self.deadline = deadline
        self.request: wire.Request | None = None
        """The request's head, once it is in (then its body is awaited)."""
        self.length = 0
        """The body's length, once the head is in."""


class Lobby:
    """New connections of one server waiting for their first request (see
    the module's docstring).

    ``host``: the server (its limits, ``waiting``, ``connections`` and
    tally, and the nursery the waiting task runs in); ``starter``: called
    with a connection whose request is in, to serve it in a task of its own.
    """

    def __init__(self, host: Host, starter: _Starter) -> None:
        self._host = host
        self._starter = starter
        self._epoll: select.epoll | None = None
        self._guests: dict[int, _Guest] = {}
        # The waits in deadline order (each kind has one timeout, so the
        # order in which they began or last made progress).
        self._heads: OrderedDict[int, _Guest] = OrderedDict()
        self._bodies: OrderedDict[int, _Guest] = OrderedDict()
        self._wait_scope: trio.CancelScope | None = None
        self._running = False

    def __len__(self) -> int:
        return len(self._guests)

    def arrive(self, conn: Connection) -> First | None:
        """A new connection (already in the server's ``connections``): read
        what its client has sent. Returns what its task starts with when its
        request is in (or the client sent garbage); None when it waits here
        or was closed (its client left)."""
        fd = conn.stream.socket.fileno()
        guest = _Guest(conn, fd, trio.current_time() + self._host.limits.head_timeout_s)
        first = self._advance(guest)
        if first is not None:
            return first
        if fd < 0 or conn.stream.socket.fileno() < 0:
            return None  # (closed: the client left)
        if self._epoll is None:
            self._epoll = select.epoll()
        self._epoll.register(fd, select.EPOLLIN)
        self._guests[fd] = guest
        self._wait(guest)
        if not self._running and self._host.nursery is not None:
            self._running = True
            self._host.nursery.start_soon(self._run)
        return None

    def evict(self, conn: Connection) -> bool:
        """Close ``conn`` if it waits here (the server's cap needs its
        room); False when it is not a guest."""
        guest = self._guests.get(conn.stream.socket.fileno())
        if guest is None or guest.conn is not conn:
            return False
        self._close(guest)
        return True

    def close(self) -> None:
        """At shutdown: close every connection waiting here."""
        for guest in list(self._guests.values()):
            self._close(guest)
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    # -- the waits -----------------------------------------------------------

    def _wait(self, guest: _Guest) -> None:
        """Start (or restart) ``guest``'s wait: the server's ``waiting``
        (the end: the latest to begin), and its deadline."""
        waiting = self._host.waiting
        waiting.pop(guest.conn, None)
        waiting[guest.conn] = None
        if guest.request is None:
            self._heads[guest.fd] = guest
        else:
            self._heads.pop(guest.fd, None)
            self._bodies.pop(guest.fd, None)
            guest.deadline = trio.current_time() + self._host.limits.body_timeout_s
            self._bodies[guest.fd] = guest
        scope = self._wait_scope
        if scope is not None and guest.deadline < scope.deadline:
            scope.deadline = guest.deadline

    def _advance(self, guest: _Guest) -> First | None:
        """Read what ``guest``'s client sent and parse it: what its task
        starts with when the request is in; None when it must wait (or was
        closed)."""
        conn = guest.conn
        parser = conn.wire
        try:
            data = sockio.read_now(conn.stream, _READ)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if data == b"":
            # The client left (or reset) before its request was in: as the
            # task would, close without a word.
            self._close(guest)
            return None
        if data is not None:
            parser.receive_data(data)
        if guest.request is None:
            try:
                event = parser.next_event()
            except wire.ProtocolError as exc:
                return exc
            if event is wire.NEED_DATA:
                return None
            if not isinstance(event, wire.Request) or parser.they_are_waiting_for_100_continue:
                return event
            length = small_content_length(event.headers)
            if length is None or parser.buffered >= length:
                return event
            guest.request, guest.length = event, length
            if guest.fd in self._guests:
                self._wait(guest)  # (the body's wait begins)
            return None
        if parser.buffered >= guest.length:
            return guest.request
        if data is not None:
            self._wait(guest)  # (progress: the body's timeout starts again)
        return None

    def _leave(self, guest: _Guest) -> None:
        """``guest`` waits here no more (its socket stays open)."""
        fd = guest.fd
        if self._guests.pop(fd, None) is None:
            return
        self._heads.pop(fd, None)
        self._bodies.pop(fd, None)
        self._host.waiting.pop(guest.conn, None)
        if self._epoll is not None:
            with contextlib.suppress(OSError):  # (already closed)
                self._epoll.unregister(fd)

    def _close(self, guest: _Guest) -> None:
        self._leave(guest)
        self._host.connections.discard(guest.conn)
        guest.conn.stream.socket.close()

    def _expire(self, now: float) -> None:
        """Answer and close up to :data:`_BATCH` waits past their deadline."""
        host = self._host
        limits = host.limits
        for _ in range(_BATCH):
            head = next(iter(self._heads.values()), None)
            body = next(iter(self._bodies.values()), None)
            if head is not None and head.deadline <= now:
                host.tally.head_timeouts += 1
                if head.conn.wire.buffered:
                    head.conn.error_now(408, "request_timeout", head_timeout_message(limits))
                self._close(head)
            elif body is not None and body.deadline <= now:
                host.tally.body_timeouts += 1
                body.conn.error_now(408, "request_timeout", body_timeout_message(limits))
                self._close(body)
            else:
                return

    def _next_deadline(self) -> float:
        head = next(iter(self._heads.values()), None)
        body = next(iter(self._bodies.values()), None)
        deadline = head.deadline if head is not None else float("inf")
        return min(deadline, body.deadline) if body is not None else deadline

    async def _run(self) -> None:
        """Wait for the guests' clients (and deadlines) until none is left."""
        epoll = self._epoll
        assert epoll is not None
        try:
            while self._guests:
                with trio.CancelScope(deadline=self._next_deadline()) as scope:
                    self._wait_scope = scope
                    await trio.lowlevel.wait_readable(epoll.fileno())
                self._wait_scope = None
                for fd, _ in epoll.poll(0, _BATCH):
                    guest = self._guests.get(fd)
                    if guest is None:
                        continue
                    first = self._advance(guest)
                    if first is not None:
                        self._leave(guest)
                        self._starter.start(guest.conn, first)
                self._expire(trio.current_time())
        finally:
            # Cancelled (the server's nursery ends): nobody waits for them now.
            for guest in list(self._guests.values()):
                self._close(guest)
            self._wait_scope = None
            self._running = False
            self._epoll = None
            trio.lowlevel.notify_closing(epoll.fileno())
            epoll.close()
