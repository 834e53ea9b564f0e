"""The server's limits on a connection: how long a head, a body and a write
may take, and what a malformed request gets. On loopback TCP pairs under
MockClock, so every timeout is checked at its exact virtual time."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest
import trio
import trio.testing

from tests.http.virtual import tcp_pair
from yard.h1.server import ASGIApp, Limits, Server

Scope = dict[str, Any]
Connect = Callable[[], Awaitable[trio.SocketStream]]


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _echo(scope: Scope, receive: Any, send: Any) -> None:
    """Answers with the request's method, path and body length, once the
    body is in (or says nothing when the client went away)."""
    if scope["type"] == "lifespan":
        return await _lifespan(receive, send)
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    answer = b"%s %s %d" % (scope["method"].encode(), scope["path"].encode(), size)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", b"%d" % len(answer))],
        }
    )
    await send({"type": "http.response.body", "body": answer})


@asynccontextmanager
async def _served(app: Any = _echo, **limits: Any) -> AsyncIterator[Connect]:
    """Connections to a :class:`Server` with ``limits``, handed straight to it
    (no listener, so no TCP_DEFER_ACCEPT wait on the kernel's clock)."""
    async with trio.open_nursery() as nursery:
        server = Server(cast(ASGIApp, app), limits=Limits(**limits))
        server.nursery = nursery

        clients: list[trio.SocketStream] = []

        async def connect() -> trio.SocketStream:
            server_end, client_end = await tcp_pair()
            clients.append(client_end)
            nursery.start_soon(server.handle, server_end)
            return client_end

        try:
            yield connect
        finally:
            nursery.cancel_scope.cancel()
            for client in clients:
                client.socket.close()


async def _read_to_close(stream: trio.SocketStream) -> bytes:
    got = b""
    while True:
        try:
            piece = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            break
        if not piece:
            break
        got += piece
    return got


async def _closed(stream: trio.SocketStream) -> tuple[bytes, float]:
    """What the server sends until it closes, and how many (virtual)
    seconds that took."""
    t0 = trio.current_time()
    with trio.fail_after(200):
        got = await _read_to_close(stream)
    return got, trio.current_time() - t0


def _error_code(answer: bytes) -> str:
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    return str(body["error"]["code"])


def _assert_timed_out(answer: bytes) -> None:
    """``answer`` is the 408 of a request that stopped coming, and the end."""
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"connection: close" in answer
    assert _error_code(answer) == "request_timeout"


# -- the request head ----------------------------------------------------------


async def test_a_head_that_never_completes_gets_408_at_head_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _served() as connect:
        client = await connect()
        await client.send_all(b"POST /login HTTP/1.1\r\nhost: x\r\n")
        got, waited = await _closed(client)
        assert waited == 10.0
    _assert_timed_out(got)


async def test_a_head_that_trickles_in_is_not_given_more_time_per_byte(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _served(head_timeout_s=4.0) as connect:
        client = await connect()
        t0 = trio.current_time()
        closed_at: list[float] = []

        async def read() -> None:
            await _read_to_close(client)
            closed_at.append(trio.current_time() - t0)

        with trio.fail_after(200):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    for byte in b"GET / HTTP/1.1\r\nhost: x\r\n":
                        await client.send_all(bytes([byte]))
                        await trio.sleep(1.0)
    assert closed_at == [4.0]


async def test_a_connection_that_sends_nothing_is_closed_at_head_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _served() as connect:
        client = await connect()
        got, waited = await _closed(client)
        assert waited == 10.0
    assert got == b""  # no request began: nothing to answer


async def test_an_idle_keep_alive_connection_closes_after_keep_alive_s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _served(keep_alive_s=75.0) as connect:
        client = await connect()
        await client.send_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
        with trio.fail_after(5):
            assert (await client.receive_some(65536)).endswith(b"GET /a 0")
        t0 = trio.current_time()
        # Idle between requests: the keep-alive timer, not the head's.
        await trio.sleep(60.0)
        await client.send_all(b"GET /b HTTP/1.1\r\nhost: x\r\n\r\n")
        with trio.fail_after(5):
            assert (await client.receive_some(65536)).endswith(b"GET /b 0")
        t1 = trio.current_time()
        with trio.fail_after(200):
            assert await _read_to_close(client) == b""
        assert trio.current_time() - t1 == 75.0
        assert t1 - t0 == 60.0


async def test_a_second_head_that_stalls_gets_head_timeout_from_its_first_byte(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _served() as connect:
        client = await connect()
        await client.send_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
        with trio.fail_after(5):
            await client.receive_some(65536)
        await trio.sleep(30.0)
        await client.send_all(b"GET /b HTTP/1.1\r\n")
        got, waited = await _closed(client)
        assert waited == 10.0
    assert got.startswith(b"HTTP/1.1 408 ")


# -- the request body ----------------------------------------------------------


async def test_a_body_that_stops_coming_gets_408_at_body_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _served() as connect:
        client = await connect()
        await client.send_all(b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n")
        await trio.sleep(5.0)
        await client.send_all(b"x" * 10)
        got, waited = await _closed(client)
        assert waited == 30.0
    _assert_timed_out(got)


async def test_a_slow_body_that_keeps_coming_is_read_to_its_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _served(body_timeout_s=30.0) as connect:
        client = await connect()
        await client.send_all(b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 40\r\n\r\n")
        for _ in range(4):
            await trio.sleep(25.0)  # under the limit each time, 100 s in all
            await client.send_all(b"x" * 10)
        with trio.fail_after(5):
            got = await client.receive_some(65536)
    assert got.endswith(b"POST /up 40")


# -- malformed bodies ----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"zz\r\nhello\r\n0\r\n\r\n", id="size-not-hex"),
        pytest.param(b"5\nhello\r\n0\r\n\r\n", id="lf-only-size-line"),
        pytest.param(b"3\r\nhello\r\n0\r\n\r\n", id="more-data-than-the-size"),
    ],
)
async def test_a_malformed_chunked_body_gets_400_json(body: bytes) -> None:
    async with _served() as connect:
        client = await connect()
        await client.send_all(
            b"POST /up HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n" + body
        )
        with trio.fail_after(5):
            got = await _read_to_close(client)
    assert got.startswith(b"HTTP/1.1 400 ")
    assert b"content-type: application/json" in got
    assert _error_code(got) == "malformed_request"
    assert b"chunk" in got.partition(b"\r\n\r\n")[2]


async def test_a_chunked_body_on_http_1_0_is_refused() -> None:
    async with _served() as connect:
        client = await connect()
        await client.send_all(
            b"POST /up HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
        with trio.fail_after(5):
            got = await _read_to_close(client)
    assert got.startswith(b"HTTP/1.1 400 ")
    assert _error_code(got) == "malformed_request"


async def test_a_malformed_head_gets_400_json() -> None:
    async with _served() as connect:
        client = await connect()
        await client.send_all(b"NOT HTTP AT ALL\r\n\r\n")
        with trio.fail_after(5):
            got = await _read_to_close(client)
    assert got.startswith(b"HTTP/1.1 400 ")
    assert _error_code(got) == "malformed_request"


# -- a client that stops reading -----------------------------------------------


class _Cuts:
    """When the flood was cut (virtual times), and an event for the first."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.event = trio.Event()


CUT = _Cuts()


async def _flood(scope: Scope, receive: Any, send: Any) -> None:
    """Streams 64 KiB pieces until the server cancels it (the client left)."""
    if scope["type"] == "lifespan":
        return await _lifespan(receive, send)
    await receive()
    watcher = scope["extensions"]["yard.disconnect"]
    with trio.CancelScope() as cancel_scope:
        watcher.watch(cancel_scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        pieces = int(scope["query_string"] or b"0") or 10**9
        for _ in range(pieces):
            await trio.lowlevel.checkpoint()  # (as a backend's next chunk would)
            await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    CUT.times.append(trio.current_time())
    CUT.event.set()


async def test_a_client_that_stops_reading_is_cut_at_send_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    global CUT
    CUT = _Cuts()
    async with _served(_flood) as connect:
        client = await connect()
        t0 = trio.current_time()
        await client.send_all(b"GET /flood HTTP/1.1\r\nhost: x\r\n\r\n")
        with trio.fail_after(200):
            await CUT.event.wait()
        # The buffers fill at once (virtual time stands still), then 30 s
        # with no progress.
        assert CUT.times == [t0 + 30.0]
        # The connection is closed: what the client reads ends.
        with trio.fail_after(5):
            await _read_to_close(client)


async def test_a_slow_reader_that_keeps_reading_gets_the_whole_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    global CUT
    CUT = _Cuts()
    pieces = 200  # 12.5 MiB: far more than the socket buffers hold
    async with _served(_flood, send_timeout_s=30.0) as connect:
        client = await connect()
        await client.send_all(b"GET /flood?%d HTTP/1.1\r\nhost: x\r\n\r\n" % pieces)
        got = 0
        with trio.fail_after(10_000):
            while True:
                await trio.sleep(20.0)  # a pause under the limit between reads
                piece = await client.receive_some(1 << 20)
                got += len(piece)
                if piece.endswith(b"0\r\n\r\n"):
                    break
    assert CUT.times == []
    assert got > pieces * 65536


# -- accept failures -----------------------------------------------------------


class _FullListener:
    """A listener whose accept always fails as at RLIMIT_NOFILE."""

    def __init__(self) -> None:
        self.calls = 0

    async def accept(self) -> trio.SocketStream:
        self.calls += 1
        await trio.lowlevel.checkpoint()
        raise OSError(errno.EMFILE, "Too many open files")


async def test_accept_failures_are_logged_at_most_once_per_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    listener = _FullListener()
    server = Server(cast(ASGIApp, _echo))
    with caplog.at_level(logging.WARNING, logger="yard.http.server"):
        with trio.move_on_after(60.5):
            async with trio.open_nursery() as nursery:
                server.nursery = nursery
                await server.accept_and_serve(cast(trio.SocketListener, listener))
    lines = [r.getMessage() for r in caplog.records]
    assert listener.calls > 100  # it kept retrying...
    assert 1 <= len(lines) <= 7  # ... but said so once per 10 s
    assert "Too many open files" in lines[0]
    assert any("more" in line for line in lines[1:])


# -- the connection cap (real sockets: the accept loop) -------------------------


class _Holder:
    """An app whose ``/hold`` requests wait until released."""

    def __init__(self) -> None:
        self.held = 0
        self.changed = trio.Event()
        self.release = trio.Event()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        await receive()
        if scope["path"] == "/hold":
            self.held += 1
            self.changed.set()
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok " + scope["path"].encode()})

    async def wait_held(self, count: int) -> None:
        while self.held < count:
            self.changed = trio.Event()
            await self.changed.wait()


async def test_over_the_cap_only_healthz_and_the_admin_key_are_served_then_all_is_refused() -> None:
    from yard.h1.server import serve

    app = _Holder()
    limits = Limits(max_connections=3, reserved_connections=2)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                functools.partial(
                    serve, cast(ASGIApp, app), "127.0.0.1", 0, limits=limits, admin_key="adm"
                )
            )
            port = int(binds[0].rsplit(":", 1)[1])
            opened: list[trio.SocketStream] = []

            async def send(request: bytes) -> trio.SocketStream:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                opened.append(stream)
                await stream.send_all(request)
                return stream

            try:
                hold = b"GET /hold HTTP/1.1\r\nhost: x\r\n\r\n"
                for count in range(1, 4):
                    await send(hold)
                    await app.wait_held(count)
                # At the cap: an ordinary request is refused, with Retry-After.
                got = await _read_to_close(
                    await send(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
                )
                assert got.startswith(b"HTTP/1.1 503 ")
                assert b"retry-after: 1" in got
                assert _error_code(got) == "too_many_connections"
                # A head that is not there whole at once does not hold the
                # reserve: it is refused at once.
                for _ in range(3):
                    got = await _read_to_close(await send(b"GET /healthz HTTP/1.1\r\n"))
                    assert got.startswith(b"HTTP/1.1 503 ")
                # The reserve serves the health check and the admin key (once).
                got = await _read_to_close(await send(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"))
                assert got.startswith(b"HTTP/1.1 200 ")
                assert b"ok /healthz" in got
                admin = b"GET /hold HTTP/1.1\r\nhost: x\r\nauthorization: Bearer adm\r\n\r\n"
                await send(admin)
                await app.wait_held(4)
                await send(admin)
                await app.wait_held(5)
                # Cap and reserve full: even the health check is refused at once.
                got = await _read_to_close(await send(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"))
                assert got.startswith(b"HTTP/1.1 503 ")
                assert _error_code(got) == "too_many_connections"
                # Room again once the held requests end.
                app.release.set()
                for stream in opened[:3]:
                    await stream.aclose()
                await trio.sleep(0.05)
                got = await _read_to_close(
                    await send(b"GET /fine HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                )
                assert got.startswith(b"HTTP/1.1 200 ")
            finally:
                for stream in opened:
                    stream.socket.close()
            nursery.cancel_scope.cancel()


def test_the_cap_is_lowered_to_fit_the_open_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    from yard.h1.server import connection_cap

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    # Each connection may hold a backend connection too; 128 kept for the rest.
    assert connection_cap(5000, 8) == (1024 - 128) // 2 - 8
    assert connection_cap(100, 8) == 100


@pytest.mark.parametrize(
    "slow_request",
    [
        pytest.param(b"POST /login HTTP/1.1\r\n", id="head"),
        pytest.param(
            b"POST /login HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nab", id="body"
        ),
        # Answered before its body came (a refusal): the server waits for the
        # rest of the body only to reuse the connection.
        pytest.param(
            b"POST /refused HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n",
            id="body-after-the-answer",
        ),
    ],
)
async def test_at_the_cap_the_connection_waiting_longest_on_its_client_makes_room(
    slow_request: bytes,
) -> None:
    from yard.h1.server import open_listeners

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("path") != "/refused":
            return await _echo(scope, receive, send)
        await send({"type": "http.response.start", "status": 403, "headers": []})
        await send({"type": "http.response.body", "body": b"no"})

    server = Server(cast(ASGIApp, app), limits=Limits(max_connections=3, reserved_connections=1))
    listeners = await open_listeners("127.0.0.1", 0)
    port = listeners[0].socket.getsockname()[1]
    slow: list[trio.SocketStream] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server.nursery = nursery
            nursery.start_soon(server.accept_and_serve, listeners[0])
            try:
                # Three slowloris heads (or bodies) fill the cap, oldest first.
                for _ in range(3):
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    slow.append(stream)
                    await stream.send_all(slow_request)
                    await trio.testing.wait_all_tasks_blocked(0.05)
                assert len(server.connections) == 3
                # A whole request is served: the oldest slow one made room.
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                slow.append(stream)
                await stream.send_all(b"GET /v1/x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                got = await _read_to_close(stream)
                assert got.startswith(b"HTTP/1.1 200 ")
                assert got.endswith(b"GET /v1/x 0")
                # Closed (unanswered, or after its answer).
                first = await _read_to_close(slow[0])
                assert first == b"" or first.startswith(b"HTTP/1.1 403 ")
            finally:
                for stream in slow:
                    stream.socket.close()
                listeners[0].socket.close()
                nursery.cancel_scope.cancel()
