"""yard's HTTP/1.1 server with small ASGI apps, over raw loopback sockets."""

from __future__ import annotations

import functools
import socket
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import trio
import trio.testing

from yard.h1.server import ASGIApp, serve

Scope = dict[str, Any]


async def _app(scope: Scope, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if path == "/boom":
        raise RuntimeError("the app failed")
    if path == "/wait-for-hang-up":
        watcher = scope["extensions"]["yard.disconnect"]
        with trio.CancelScope() as cancel_scope:
            watcher.watch(cancel_scope)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
            await trio.sleep_forever()
        HANG_UPS.append(path)
        HANG_UP.set()
        return
    answer = b"%s %s %d" % (scope["method"].encode(), path.encode(), len(body))
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", b"%d" % len(answer))],
            "yard.hold": True,
        }
    )
    await send({"type": "http.response.body", "body": answer})


HANG_UPS: list[str] = []
HANG_UP = trio.Event()


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve, cast(ASGIApp, _app), "127.0.0.1", 0))
        yield int(binds[0].rsplit(":", 1)[1])
        nursery.cancel_scope.cancel()


async def _exchange(port: int, data: bytes, *, until: bytes) -> bytes:
    """Send ``data``; read until ``until`` has arrived or the server closes."""
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(data)
            got = b""
            while until not in got:
                piece = await stream.receive_some(65536)
                if not piece:
                    break
                got += piece
            return got


async def test_a_small_answer_leaves_in_one_piece_with_its_head(port: int) -> None:
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc")
            got = await stream.receive_some(65536)
    assert got.startswith(b"HTTP/1.1 200 OK\r\n")
    assert got.endswith(b"\r\n\r\nPOST /a 3")


async def test_pipelined_requests_are_answered_in_order(port: int) -> None:
    two = b"GET /one HTTP/1.1\r\nhost: x\r\n\r\nGET /two HTTP/1.1\r\nhost: x\r\n\r\n"
    got = await _exchange(port, two, until=b"GET /two 0")
    assert got.index(b"GET /one 0") < got.index(b"GET /two 0")


async def test_expect_100_continue_is_answered_before_the_body(port: int) -> None:
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(
                b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n"
            )
            interim = await stream.receive_some(65536)
            assert interim.startswith(b"HTTP/1.1 100 ")
            await stream.send_all(b"hi")
            got = await stream.receive_some(65536)
    assert got.endswith(b"POST /up 2")


async def test_head_answers_carry_no_body(port: int) -> None:
    got = await _exchange(port, b"HEAD /h HTTP/1.1\r\nhost: x\r\n\r\n", until=b"\r\n\r\n")
    assert b"content-length: 9" in got
    assert got.startswith(b"HTTP/1.1 200 OK")
    assert got.endswith(b"\r\n\r\n")


async def test_an_app_error_is_a_500_and_the_server_goes_on(port: int) -> None:
    got = await _exchange(port, b"GET /boom HTTP/1.1\r\nhost: x\r\n\r\n", until=b"error")
    assert got.startswith(b"HTTP/1.1 500 ")
    again = await _exchange(port, b"GET /fine HTTP/1.1\r\nhost: x\r\n\r\n", until=b"GET /fine 0")
    assert again.endswith(b"GET /fine 0")


async def test_garbage_gets_a_400(port: int) -> None:
    got = await _exchange(port, b"NOT HTTP AT ALL\r\n\r\n", until=b"no such thing")
    assert got.startswith(b"HTTP/1.1 400 ")


async def test_a_client_hanging_up_cancels_the_scope_the_app_watches(port: int) -> None:
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /wait-for-hang-up HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200")
        await stream.aclose()
        await HANG_UP.wait()
    assert HANG_UPS == ["/wait-for-hang-up"]


async def test_a_request_that_arrives_while_the_hang_up_watch_reads_is_never_lost() -> None:
    # The next request reaches the socket while the app still works on this
    # one, so the reader that watches for a hang-up takes it (and holds it
    # across Trio's post-read checkpoint) while the app answers and the
    # connection's task turns to reading the next request itself. Which of
    # the two runs first is up to Trio's shuffled batches; over 40 requests
    # both orders happen, and not one request may be lost.
    request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
    rounds = 40
    served = 0
    all_served = trio.Event()
    client: socket.socket | None = None

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        nonlocal served
        if scope["type"] == "lifespan":
            await _app(scope, receive, send)
            return
        await receive()  # the body is in: the watch starts
        assert client is not None
        if served < rounds:
            client.sendall(request)  # the next one, sent by a blocking client
        await trio.lowlevel.checkpoint()  # the watch reads it
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"2")],
                "yard.hold": True,
            }
        )
        await send({"type": "http.response.body", "body": b"ok"})
        served += 1
        if served > rounds:
            all_served.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                functools.partial(serve, cast(ASGIApp, app), "127.0.0.1", 0)
            )
            client = socket.create_connection(("127.0.0.1", int(binds[0].rsplit(":", 1)[1])))
            with client:
                client.sendall(request)
                await all_served.wait()
            nursery.cancel_scope.cancel()
    assert served == rounds + 1
