"""Waking nodes with PostgreSQL's ``LISTEN``/``NOTIFY``, without polling.

Rules this module keeps:

- One dedicated connection, used for nothing but ``LISTEN``. Once listening,
  Trio waits for its socket to become readable
  (``trio.lowlevel.wait_readable``) and then reads what arrived with libpq's
  non-blocking calls (``PQconsumeInput``, ``PQnotifies``): no thread sits in
  a blocking read, no timer polls, and a wait is cancelled at once.
  Connecting (blocking, bounded by the connect timeout) runs in a worker
  thread.
- A lost connection is reconnected by the listener itself, with a backoff
  from 50 ms to 2 s. Notifications sent while it was away are lost, so after
  a reconnect every channel is reported as fired: callers look again.
- A notification only says "look": the database is the truth. Several
  notifications on one channel before a :meth:`Listener.wait` come out as
  one; their payloads (say, the ids of jobs that ended) are kept apart for
  :meth:`Listener.payloads`, bounded.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType

import psycopg
import trio
from psycopg import sql

from yard.cluster.pg import DatabaseLost, PgLimits, connect
from yard.cluster.schema import JOBS_CHANNEL, NODES_CHANNEL
from yard.db import Row

__all__ = ["Listener", "ListenerStatistics"]

log = logging.getLogger("yard.cluster")

RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 2.0
MAX_PAYLOADS = 10_000
"""Payloads kept per channel between two :meth:`Listener.payloads` calls;
beyond that the channel counts as missed (look at everything)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerStatistics:
    """connected: whether it listens now. connects: successful connections
    so far (more than one: it reconnected). notifications: how many arrived."""

    connected: bool
    connects: int
    notifications: int


class Listener:
    """Notifications on ``channels`` of the database at ``dsn``.

    Use as ``async with Listener(dsn) as listener:`` then
    ``await listener.wait(timeout)``. Entering returns once the listener
    listens, or once its first attempt to connect has failed (it keeps
    trying: see :attr:`connected`); it never raises for a server that is
    down. Meant for one waiting task.
    """

    def __init__(
        self,
        dsn: str,
        channels: Sequence[str] = (JOBS_CHANNEL, NODES_CHANNEL),
        *,
        application_name: str = "yard listener",
        limits: PgLimits | None = None,
    ) -> None:
        if not channels:
            raise ValueError("a listener needs at least one channel")
        self._dsn = dsn
        self._channels = tuple(channels)
        self._application_name = application_name
        self._limits = limits
        self._pending: set[str] = set()
        self._early: list[tuple[str, str]] = []  # arrived while connecting
        self._payloads: dict[str, set[str]] = {channel: set() for channel in channels}
        self._missed: set[str] = set()
        self._event = trio.Event()
        self._connected = False
        self._connects = 0
        self._notifications = 0
        self._stack: AsyncExitStack | None = None
        self._cancel: trio.CancelScope | None = None

    @property
    def channels(self) -> tuple[str, ...]:
        return self._channels

    @property
    def connected(self) -> bool:
        """Whether it is listening now (False while the server is away)."""
        return self._connected

    def statistics(self) -> ListenerStatistics:
        return ListenerStatistics(
            connected=self._connected,
            connects=self._connects,
            notifications=self._notifications,
        )

    async def __aenter__(self) -> Listener:
        if self._stack is not None:
            raise RuntimeError("this listener is already open")
        stack = AsyncExitStack()
        nursery = await stack.enter_async_context(trio.open_nursery())
        self._cancel = nursery.cancel_scope
        try:
            await nursery.start(self._run)
        except BaseException:
            nursery.cancel_scope.cancel()
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        assert stack is not None and self._cancel is not None
        self._cancel.cancel()
        return await stack.__aexit__(exc_type, exc, tb)

    async def wait(self, timeout: float | None = None) -> frozenset[str]:  # noqa: ASYNC109
        """Wait until a notification arrives on one of the channels (or the
        listener reconnected) and return the channels that fired since the
        last call; after ``timeout`` seconds (None: no limit) return the
        empty set. Cancelling it loses nothing: what arrived stays for the
        next call. (The timeout is part of the answer here, not an error.)"""
        with trio.move_on_after(math.inf if timeout is None else timeout):
            while not self._pending:
                if self._event.is_set():
                    self._event = trio.Event()
                await self._event.wait()
        await trio.lowlevel.checkpoint()
        fired = frozenset(self._pending)
        self._pending.clear()
        return fired

    def payloads(self, channel: str) -> frozenset[str] | None:
        """The payloads that arrived on ``channel`` since the last call (say,
        the ids of jobs that ended), or None if some may have been missed (a
        reconnect, or more than :data:`MAX_PAYLOADS`): then look at
        everything. Independent of :meth:`wait`."""
        kept = self._payloads[channel]
        self._payloads[channel] = set()
        if channel in self._missed:
            self._missed.discard(channel)
            return None
        return frozenset(kept)

    def _fire(self, channels: set[str] | tuple[str, ...]) -> None:
        self._pending.update(channels)
        self._event.set()

    def _heard(self, channel: str, payload: str) -> None:
        self._notifications += 1
        kept = self._payloads.get(channel)
        if kept is None:
            return
        if len(kept) >= MAX_PAYLOADS:
            self._missed.add(channel)
            kept.clear()
        elif channel not in self._missed:
            kept.add(payload)

    def _missed_all(self) -> None:
        for channel in self._channels:
            self._missed.add(channel)
            self._payloads[channel].clear()

    def _connect(self) -> psycopg.Connection[Row]:
        conn = connect(self._dsn, application_name=self._application_name, limits=self._limits)
        try:
            # Anything that arrives while the LISTENs run comes through here.
            conn.add_notify_handler(lambda n: self._early.append((n.channel, n.payload)))
            for channel in self._channels:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        except psycopg.Error as exc:
            conn.close()
            raise DatabaseLost(f"cannot listen on PostgreSQL: {exc}") from exc
        return conn

    async def _run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        backoff = RECONNECT_MIN_S
        started = False
        while True:
            self._early = []
            try:
                conn = await trio.to_thread.run_sync(self._connect)
            except DatabaseLost as exc:
                if backoff == RECONNECT_MIN_S:  # once per outage, not per attempt
                    log.warning("cluster: not listening for notifications: %s", exc)
                if not started:
                    task_status.started()
                    started = True
                await trio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
                continue
            backoff = RECONNECT_MIN_S
            self._connects += 1
            self._connected = True
            if self._connects > 1:
                log.info("cluster: listening for notifications again")
                self._missed_all()
                self._fire(self._channels)
            # Arrived during the LISTENs, in the worker thread: taken in here.
            for channel, payload in self._early:
                self._heard(channel, payload)
            if self._early:
                self._fire({channel for channel, _ in self._early})
            if not started:
                task_status.started()
                started = True
            try:
                await self._listen(conn)
            except psycopg.Error as exc:
                log.warning("cluster: lost the notification connection: %s", exc)
            finally:
                self._connected = False
                conn.close()

    async def _listen(self, conn: psycopg.Connection[Row]) -> None:
        pgconn = conn.pgconn
        while True:
            await trio.lowlevel.wait_readable(pgconn.socket)
            pgconn.consume_input()
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the connection is closed")
            fired: set[str] = set()
            while (notify := pgconn.notifies()) is not None:
                channel = notify.relname.decode()
                self._heard(channel, notify.extra.decode())
                fired.add(channel)
            if fired:
                self._fire(fired)
