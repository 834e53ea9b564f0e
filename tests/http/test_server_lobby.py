"""A new connection waits for its first request without a task of its own
(:class:`yard.h1.lobby.Lobby`), under the same limits as a connection's
task keeps: the head timeout, the small body's timeout, the cap's eviction of
the longest waiting, shutdown. Timed cases on loopback TCP pairs handed to
:meth:`Server.admit` under MockClock (exact virtual times); the accept loop's
case on a real listener."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import trio
import trio.lowlevel
import trio.testing

from tests.http.virtual import tcp_pair
from yard.h1.server import ASGIApp, Limits, Server, open_listeners

Scope = dict[str, Any]


class _App:
    """Answers with the request's path and body; records what it saw."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        self.seen.append(scope["path"])
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        answer = scope["path"].encode() + b" " + body
        head = [(b"content-length", b"%d" % len(answer))]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": answer})


@asynccontextmanager
async def _admitted(
    app: _App, **limits: Any
) -> AsyncIterator[tuple[Server, list[trio.SocketStream], trio.Nursery]]:
    """A server, and a list its new connections (client ends, made by
    ``connect``) are kept in; everything is closed on the way out."""
    server = Server(cast(ASGIApp, app), limits=Limits(**limits))
    clients: list[trio.SocketStream] = []
    try:
        async with trio.open_nursery() as nursery:
            server.nursery = nursery
            yield server, clients, nursery
            nursery.cancel_scope.cancel()
    finally:
        for client in clients:
            client.socket.close()


async def _connect(
    server: Server, clients: list[trio.SocketStream], data: bytes
) -> trio.SocketStream:
    """A new connection, admitted as the accept loop does, once ``data`` is
    there (as TCP_DEFER_ACCEPT has it)."""
    server_end, client = await tcp_pair()
    clients.append(client)
    if data:
        await client.send_all(data)
        await trio.lowlevel.checkpoint()  # (on loopback it is there at once)
    server.admit(server_end)
    return client


async def _until_closed(stream: trio.SocketStream) -> tuple[bytes, float]:
    """What the server sends until it closes, and the virtual seconds it took."""
    t0 = trio.current_time()
    got = b""
    with trio.fail_after(300):
        while True:
            try:
                piece = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not piece:
                break
            got += piece
    return got, trio.current_time() - t0


def _code(answer: bytes) -> str:
    return str(json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"])


def _tasks(nursery: trio.Nursery) -> int:
    return len(nursery.child_tasks)


async def test_connections_waiting_on_their_first_request_cost_no_task_each() -> None:
    app = _App()
    server = Server(cast(ASGIApp, app), limits=Limits(max_connections=100))
    listeners = await open_listeners("127.0.0.1", 0)
    port = listeners[0].socket.getsockname()[1]
    clients: list[trio.SocketStream] = []
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                server.nursery = nursery
                nursery.start_soon(server.accept_and_serve, listeners[0])
                # Forty slowloris heads and forty heads whose small body never comes.
                for i in range(80):
                    client = await trio.open_tcp_stream("127.0.0.1", port)
                    clients.append(client)
                    await client.send_all(
                        b"GET /slow HTTP/1.1\r\nhost: x\r\n"
                        if i % 2
                        else b"POST /login HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n"
                    )
                for _ in range(500):
                    if server.statistics().open_connections == 80:
                        break
                    await trio.sleep(0.01)  # (the kernel's handshakes)
                await trio.testing.wait_all_tasks_blocked(0.05)
                assert server.statistics().waiting_connections == 80
                # The acceptor and the one task that waits for all of them
                # (before: a task per connection, 81).
                assert _tasks(nursery) == 2
                # A whole request still gets its answer at once.
                probe = await trio.open_tcp_stream("127.0.0.1", port)
                clients.append(probe)
                await probe.send_all(
                    b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                )
                got, _ = await _until_closed(probe)
                assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"/healthz ")
                # Heads that complete are served, in a task of their own then.
                for client in clients[1:80:2]:
                    await client.send_all(b"connection: close\r\n\r\n")
                for client in clients[1:80:2]:
                    got, _ = await _until_closed(client)
                    assert got.endswith(b"/slow ")
                assert app.seen.count("/slow") == 40
                assert "/login" not in app.seen
                nursery.cancel_scope.cancel()
    finally:
        listeners[0].socket.close()
        for client in clients:
            client.socket.close()
    # Whatever still waited was closed with the server's nursery.
    assert server.statistics().open_connections == 0


async def test_a_head_that_never_completes_gets_408_at_the_head_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = _App()
    async with _admitted(app) as (server, clients, _):
        partial = await _connect(server, clients, b"POST /login HTTP/1.1\r\nhost: x\r\n")
        silent = await _connect(server, clients, b"")
        got, waited = await _until_closed(partial)
        assert (got[:13], _code(got), waited) == (b"HTTP/1.1 408 ", "request_timeout", 10.0)
        assert b"server.head_timeout_s" in got
        got, waited = await _until_closed(silent)
        assert (got, waited) == (b"", 0.0)  # (closed in the same step)
    assert server.statistics().head_timeouts == 2
    assert app.seen == []


async def test_a_head_that_trickles_in_gets_no_more_time_per_byte(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _admitted(_App(), head_timeout_s=4.0) as (server, clients, _):
        client = await _connect(server, clients, b"GET / HTTP/1.1\r\n")
        for _ in range(3):
            await trio.sleep(1)
            await client.send_all(b"x")
        got, waited = await _until_closed(client)
        assert got.startswith(b"HTTP/1.1 408 ")
        assert waited == 1.0  # (4 s from the connection's start)


async def test_a_head_completed_in_pieces_is_served_with_its_small_body(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = _App()
    async with _admitted(app) as (server, clients, nursery):
        client = await _connect(server, clients, b"POST /in HTTP/1.1\r\nhost: x\r\n")
        await trio.sleep(3)
        await client.send_all(b"content-length: 4\r\nconnection: close\r\n\r\nab")
        await trio.sleep(20)
        assert app.seen == []  # (its body is not all here)
        await client.send_all(b"cd")
        got, waited = await _until_closed(client)
        assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"/in abcd")
        assert waited == 0.0
        await trio.testing.wait_all_tasks_blocked()
        assert _tasks(nursery) == 0  # (its task ended, and the lobby's)


async def test_a_small_body_that_stops_coming_gets_408_at_the_body_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = _App()
    async with _admitted(app) as (server, clients, _):
        head = b"POST /login HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n"
        client = await _connect(server, clients, head + b"ab")
        for _ in range(3):
            await trio.sleep(20)  # progress: the body's 30 s start again
            await client.send_all(b"c")
        got, waited = await _until_closed(client)
        assert (got[:13], _code(got), waited) == (b"HTTP/1.1 408 ", "request_timeout", 30.0)
        assert b"server.body_timeout_s" in got
    assert server.statistics().body_timeouts == 1
    assert app.seen == []


async def test_malformed_heads_and_100_continue_go_to_a_task_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = _App()
    async with _admitted(app) as (server, clients, _):
        bad = await _connect(server, clients, b"GET / HTTP/1.1\r\nno colon here\r\n\r\n")
        got, waited = await _until_closed(bad)
        assert (got[:13], waited) == (b"HTTP/1.1 400 ", 0.0)
        expect = await _connect(
            server,
            clients,
            b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nexpect: 100-continue\r\n"
            b"connection: close\r\n\r\n",
        )
        assert (await expect.receive_some(65536)).startswith(b"HTTP/1.1 100 ")
        await expect.send_all(b"ok")
        got, _ = await _until_closed(expect)
        assert got.endswith(b"/up ok")


async def test_a_client_that_leaves_the_lobby_is_closed_without_a_word(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _admitted(_App()) as (server, clients, _):
        for data in (
            b"GET / HTTP/1.1\r\n",
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 9\r\n\r\nab",
        ):
            client = await _connect(server, clients, data)
            await trio.testing.wait_all_tasks_blocked()
            assert server.statistics().waiting_connections == 1
            await client.send_eof()
            got, waited = await _until_closed(client)
            assert (got, waited) == (b"", 0.0)
            stats = server.statistics()
            assert (stats.open_connections, stats.waiting_connections) == (0, 0)
            assert (stats.head_timeouts, stats.body_timeouts) == (0, 0)


async def test_at_the_cap_the_guest_waiting_longest_makes_room(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _admitted(_App(), max_connections=3, reserved_connections=0) as (
        server,
        clients,
        _,
    ):
        first = await _connect(server, clients, b"POST /a HTTP/1.1\r\nhost: x\r\n")
        second = await _connect(server, clients, b"POST /b HTTP/1.1\r\nhost: x\r\n")
        third = await _connect(server, clients, b"POST /c HTTP/1.1\r\nhost: x\r\n")
        # The first's head comes whole, its body does not: its wait for the
        # body begins now, after the others'.
        await trio.sleep(1)
        await first.send_all(b"content-length: 5\r\n\r\nab")
        await trio.testing.wait_all_tasks_blocked()
        served = await _connect(
            server, clients, b"GET /d HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        got, _ = await _until_closed(served)
        assert got.endswith(b"/d ")
        assert await _until_closed(second) == (b"", 0.0)  # (the longest waiting)
        with trio.move_on_after(1):
            await third.receive_some(65536)
            raise AssertionError("the third was closed too")
        stats = server.statistics()
        assert (stats.evicted, stats.open_connections, stats.waiting_connections) == (1, 2, 2)


async def test_at_shutdown_the_lobby_closes() -> None:
    server = Server(cast(ASGIApp, _App()))
    clients: list[trio.SocketStream] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server.nursery = nursery
            for data in (
                b"GET / HTTP/1.1\r\n",
                b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 9\r\n\r\n",
            ):
                await _connect(server, clients, data)
            await trio.testing.wait_all_tasks_blocked()
            assert server.statistics().open_connections == 2
            server.closing = True
            server.close_idle()
            for client in clients:
                assert (await _until_closed(client))[0] == b""
    for client in clients:
        client.socket.close()
    assert server.statistics().open_connections == 0
