"""Pooled keep-alive connections and the backend's idle timeout: a request
must never be written on a connection the backend is closing.

The backend here behaves as llama.cpp's server (cpp-httplib) does: it waits
``TIMEOUT`` for the next request on a kept connection, then closes it; a
loaded server takes a while between that decision and the close, and a
request that arrives meanwhile is never read (the close answers it with a
reset). Real sockets on loopback, real time."""

from __future__ import annotations

import functools

import pytest
import trio

from yard.h1 import wire
from yard.h1.upstream import DEFAULT_IDLE_S, UpstreamError, UpstreamPool, keep_alive_s

TIMEOUT = 0.4  # the backend's keep-alive timeout
CLOSING = 0.2  # how long its close takes after it decided (a loaded server)
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nkeep-alive: timeout=0.4, max=100\r\n\r\nok"


async def _keeps_alive(accepted: list[int], stream: trio.SocketStream) -> None:
    accepted.append(1)
    while True:
        data = b""
        with trio.move_on_after(TIMEOUT):
            data = await stream.receive_some(65536)
        if not data:
            # Timed out (or the client left): close, a little later.
            await trio.sleep(CLOSING)
            stream.socket.close()
            return
        await stream.send_all(ANSWER)


@pytest.mark.slow
async def test_a_connection_idle_near_the_backends_timeout_is_not_reused() -> None:
    accepted: list[int] = []
    pool = UpstreamPool()
    failures: list[str] = []
    # Pauses between requests straddling the backend's timeout; those inside
    # (TIMEOUT, TIMEOUT + CLOSING) land on a connection that is being closed.
    pauses = [0.1, TIMEOUT + 0.05, 0.1, TIMEOUT + 0.1, 0.1, TIMEOUT - 0.05, TIMEOUT + 0.15]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(
                    trio.serve_tcp,
                    functools.partial(_keeps_alive, accepted),
                    0,
                    host="127.0.0.1",
                )
            )
            url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
            for pause in [0.0, *pauses]:
                await trio.sleep(pause)
                try:
                    async with pool.request(url, b"POST", b"/v1/x", [], b"{}") as response:
                        assert await response.read() == b"ok"
                except UpstreamError as exc:
                    failures.append(f"after {pause} s idle: {exc}")
            nursery.cancel_scope.cancel()
    pool.close_idle()
    assert failures == []
    # Reused after the 0.1 s pauses only (the timeout is 0.4 s: reused while idle < 0.2 s).
    assert len(accepted) == 1 + 4


def test_how_long_a_connection_is_kept_comes_from_the_keep_alive_header() -> None:
    # As the backend sends it: the codec lower-cases the names, once.
    head = b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\ncontent-length: 0\r\n\r\n"
    conn = wire.ClientConnection()
    conn.request_sent(b"GET")
    conn.receive_data(head)
    response = conn.next_event()
    assert isinstance(response, wire.Response)
    assert keep_alive_s(response.headers) == 2.5
    assert keep_alive_s([(b"keep-alive", b"max=100, timeout = 60")]) == 30.0
    assert keep_alive_s([(b"content-type", b"text/plain")]) == DEFAULT_IDLE_S
    assert keep_alive_s([(b"keep-alive", b"timeout=soon")]) == DEFAULT_IDLE_S
    assert keep_alive_s([(b"keep-alive", b"timeout=-1")]) == DEFAULT_IDLE_S
