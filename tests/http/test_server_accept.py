"""How the server takes connections from its listeners' backlog: several per
wake-up, each counted against the connection cap before its task runs, and
nothing left listening once the server stops; and what its statistics count."""

from __future__ import annotations

import functools
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest
import trio
import trio.testing

from tests.http.virtual import tcp_pair
from yard.h1.server import ASGIApp, Limits, Server, open_listeners, serve

Scope = dict[str, Any]
HOLD = b"GET /hold HTTP/1.1\r\nhost: x\r\n\r\n"


class _Holder:
    """Holds every request until ``release`` is set; counts them."""

    def __init__(self) -> None:
        self.held = 0
        self.release = trio.Event()
        self.changed = trio.Event()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await receive()
        self.held += 1
        self.changed.set()
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def wait_held(self, count: int) -> None:
        while self.held < count:
            self.changed = trio.Event()
            await self.changed.wait()


def _accept_queue(listener: trio.SocketListener) -> int:
    """How many connections wait in ``listener``'s accept queue (Linux: a
    listening socket's ``tcp_info.tcpi_unacked``)."""
    info = listener.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 32)
    return int(struct.unpack_from("I", info, 24)[0])


async def _backlog(listener: trio.SocketListener, count: int) -> list[trio.SocketStream]:
    """``count`` connections with a whole request each, waiting in
    ``listener``'s accept queue (no acceptor runs yet)."""
    port = int(listener.socket.getsockname()[1])
    clients = []
    for _ in range(count):
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await client.send_all(HOLD)
        clients.append(client)
    for _ in range(1000):
        if _accept_queue(listener) >= count:
            break
        await trio.sleep(0.001)  # (the kernel queues them once their bytes are in)
    assert _accept_queue(listener) == count
    return clients


async def _status_line(client: trio.SocketStream) -> bytes:
    return (await client.receive_some(65536))[:12]


async def _status_lines(clients: list[trio.SocketStream]) -> list[bytes]:
    return [await _status_line(client) for client in clients]


@asynccontextmanager
async def _accepting(
    server: Server, count: int
) -> AsyncIterator[tuple[trio.SocketListener, list[trio.SocketStream], trio.Nursery]]:
    """A listener with ``count`` connections in its backlog, and a nursery
    to run the server's acceptor in."""
    listeners = await open_listeners("127.0.0.1", 0)
    clients = await _backlog(listeners[0], count)
    try:
        async with trio.open_nursery() as nursery:
            server.nursery = nursery
            try:
                yield listeners[0], clients, nursery
            finally:
                server.stop_accepting(listeners)
                nursery.cancel_scope.cancel()
    finally:
        for client in clients:
            client.socket.close()


async def test_a_backlog_is_taken_in_one_wake_up(monkeypatch: pytest.MonkeyPatch) -> None:
    accepts = 0
    accept = trio.SocketListener.accept

    async def counted(self: trio.SocketListener) -> trio.SocketStream:
        nonlocal accepts
        accepts += 1
        return await accept(self)

    monkeypatch.setattr(trio.SocketListener, "accept", counted)
    app = _Holder()
    server = Server(cast(ASGIApp, app))
    with trio.fail_after(10):
        async with _accepting(server, 5) as (listener, clients, nursery):
            nursery.start_soon(server.accept_and_serve, listener)
            await app.wait_held(5)
            await trio.testing.wait_all_tasks_blocked()
            # One accept woke with all five; the next one waits (before:
            # one accept, and one trip through the run loop, per connection:
            # six by now). Checked once every task is blocked: the acceptor
            # may be held up on a busy machine between the five and its
            # next accept.
            assert accepts == 2
            app.release.set()
            assert await _status_lines(clients) == [b"HTTP/1.1 200"] * 5


async def test_connections_taken_together_count_against_the_cap_before_they_run() -> None:
    app = _Holder()
    server = Server(cast(ASGIApp, app), limits=Limits(max_connections=3, reserved_connections=1))
    with trio.fail_after(10):
        async with _accepting(server, 6) as (listener, clients, nursery):
            nursery.start_soon(server.accept_and_serve, listener)
            await app.wait_held(3)
            # Three served, one from the reserve (503: not /healthz), two
            # refused at once; none of them waits on its client to make room.
            assert await _status_lines(clients[3:]) == [b"HTTP/1.1 503"] * 3
            assert app.held == 3
            stats = server.statistics()
            assert (stats.open_connections, stats.refused, stats.evicted) == (3, 3, 0)
            app.release.set()
            assert await _status_lines(clients[:3]) == [b"HTTP/1.1 200"] * 3


async def test_nothing_listens_once_the_server_has_stopped() -> None:
    app = _Holder()
    app.release.set()
    stop = trio.Event()
    servers: list[Server] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                functools.partial(
                    serve,
                    cast(ASGIApp, app),
                    "127.0.0.1",
                    0,
                    shutdown_trigger=stop.wait,
                    on_server=servers.append,
                )
            )
            port = int(binds[0].rsplit(":", 1)[1])
            clients = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(3)]
            try:
                for client in clients:
                    await client.send_all(HOLD)
                assert await _status_lines(clients) == [b"HTTP/1.1 200"] * 3
            finally:
                for client in clients:
                    client.socket.close()
            stop.set()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    # (on_server handed out the server, whose statistics saw them all go.)
    assert [s.statistics().open_connections for s in servers] == [0]


async def _answer_then_body(scope: Scope, receive: Any, send: Any) -> None:
    """Reads the body (``/read``), or answers 403 without reading it."""
    if scope["path"] == "/read":
        while (await receive()).get("more_body"):
            pass
    await send({"type": "http.response.start", "status": 403, "headers": []})
    await send({"type": "http.response.body", "body": b"no"})


async def test_statistics_count_what_each_limit_ended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limits = Limits(max_connections=3, reserved_connections=0, keep_alive_s=75.0)
    server = Server(cast(ASGIApp, _answer_then_body), limits=limits)
    requests = [
        b"",  # nothing: the head timeout
        b"GET / HTTP/1.1\r\n",  # part of a head: 408 at the head timeout
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\n",  # answered, then idle: keep_alive_s
        b"POST /read HTTP/1.1\r\nhost: x\r\ncontent-length: 9\r\n\r\nab",  # 408 (body)
    ]
    clients = []
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            server.nursery = nursery
            for request in requests[:3]:
                server_end, client = await tcp_pair()
                clients.append(client)
                nursery.start_soon(server.handle, server_end)
                await client.send_all(request)
                await trio.testing.wait_all_tasks_blocked()  # (they wait in this order)
            stats = server.statistics()
            assert (stats.open_connections, stats.waiting_connections) == (3, 3)
            # At the cap: the longest waiting (the silent one) makes room.
            listeners = await open_listeners("127.0.0.1", 0)
            nursery.start_soon(server.accept_and_serve, listeners[0])
            client = await trio.open_tcp_stream(*listeners[0].socket.getsockname()[:2])
            clients.append(client)
            await client.send_all(requests[3])
            await trio.sleep(200)
            server.stop_accepting(listeners)
            nursery.cancel_scope.cancel()
    for client in clients:
        client.socket.close()
    stats = server.statistics()
    assert (stats.open_connections, stats.waiting_connections) == (0, 0)
    assert (stats.evicted, stats.refused) == (1, 0)
    assert (stats.head_timeouts, stats.idle_closed, stats.body_timeouts) == (1, 1, 1)
    assert stats.send_timeouts == 0


async def test_the_app_never_sees_a_request_whose_small_body_never_comes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await _answer_then_body(scope, receive, send)

    server = Server(cast(ASGIApp, app))
    async with trio.open_nursery() as nursery:
        server.nursery = nursery
        for request in (
            b"POST /read HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nab",
            b"POST /whole HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nab",
        ):
            server_end, client = await tcp_pair()
            nursery.start_soon(server.handle, server_end)
            start = trio.current_time()
            await client.send_all(request)
            answer = b""
            while piece := await client.receive_some(65536):
                answer += piece
                if b"no" in answer.partition(b"\r\n\r\n")[2]:
                    break  # (the app's answer; a 408 closes)
            waited = trio.current_time() - start
            client.socket.close()
            if request.startswith(b"POST /read"):
                # Answered by the server at the body timeout; the app never ran.
                assert answer.startswith(b"HTTP/1.1 408 ")
                assert waited == Limits().body_timeout_s
                assert seen == []
            else:
                assert answer.startswith(b"HTTP/1.1 403 ")
                assert waited == 0
                assert seen == ["/whole"]
        nursery.cancel_scope.cancel()
    assert server.statistics().body_timeouts == 1
