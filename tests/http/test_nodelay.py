"""Small writes leave at once on both of the proxy's sockets: Nagle's
algorithm would hold a stream's first event (or a request sent after its
head) until the peer's delayed ACK, up to 40 ms on Linux."""

from __future__ import annotations

import socket

import trio

from yard.h1.server import open_listeners
from yard.h1.upstream import UpstreamPool, _origin


def _nodelay(stream: trio.SocketStream) -> bool:
    return bool(stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


async def test_client_connections_accepted_by_yard_have_nagle_off() -> None:
    listeners = await open_listeners("127.0.0.1", 0)
    port = listeners[0].socket.getsockname()[1]
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            client = await trio.open_tcp_stream("127.0.0.1", port)
            # (TCP_DEFER_ACCEPT: the accept wakes once the first bytes are in.)
            await client.send_all(b"GET / HTTP/1.1\r\n\r\n")
            accepted = await listeners[0].accept()
            assert isinstance(accepted, trio.SocketStream)
            assert _nodelay(accepted)
            await accepted.aclose()
            await client.aclose()
            nursery.cancel_scope.cancel()
    for listener in listeners:
        await listener.aclose()


async def test_backend_connections_from_the_pool_have_nagle_off() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    pool = UpstreamPool()
    with trio.fail_after(5):
        conn = await pool._acquire(_origin(f"http://127.0.0.1:{port}"))
        assert _nodelay(conn.stream)
        await conn.stream.aclose()
    for listener in listeners:
        await listener.aclose()
