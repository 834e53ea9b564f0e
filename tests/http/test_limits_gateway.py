"""Clients that stop reading cannot hold a backend's slots: the whole proxy
(server, gateway, the real engine and scheduler core) over loopback, with a
fake backend process in front of an in-process flooding backend."""

from __future__ import annotations

import functools
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from tests.http.virtual import ServedLauncher
from yard.app.web import Parts, create_app, serve_app
from yard.config import BackendConfig, Config, ServerConfig
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.engine import Engine
from yard.testing.ports import Script

SLOTS = 8
ANSWER = 8 * 2**20
SEND_TIMEOUT_S = 0.5


class _Backend:
    """Answers ``/big`` with 8 MiB, anything else with ``ok``; counts the
    answers it could not finish (the proxy hung up on it)."""

    def __init__(self) -> None:
        self.port = 0
        self.cut = 0
        self.changed = trio.Event()

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            async with stream:
                while True:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        piece = await stream.receive_some(65536)
                        if not piece:
                            return
                        data += piece
                    big = data.split(b" ", 2)[1].endswith(b"/big")
                    size = ANSWER if big else 2
                    await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
                    if big:
                        piece = b"x" * 2**20
                        for _ in range(size // len(piece)):
                            await stream.send_all(piece)
                    else:
                        await stream.send_all(b"ok")
        except trio.BrokenResourceError:
            self.cut += 1
            self.changed.set()

    async def wait_cut(self, count: int) -> None:
        while self.cut < count:
            self.changed = trio.Event()
            await self.changed.wait()


@asynccontextmanager
async def _yard(server: ServerConfig) -> AsyncIterator[tuple[str, Engine, _Backend]]:
    backend = _Backend()
    config = Config(
        path=Path("/nonexistent/yard.toml"),
        server=server,
        scheduler=SchedulerConfig(),
        devices={},
        apps={},
        backends={
            "big": BackendConfig(name="big", models=(), command=("true",), api="plain", slots=8)
        },
    )
    scheduler = Scheduler(
        [DeviceSpec(name="host", kind="host", total_bytes=64 * 2**30)],
        [BackendSpec(name="big", slots=SLOTS)],
        config.scheduler,
    )
    launcher = ServedLauncher(scripts={"big": Script(ready_after_s=0.0)})
    engine = Engine(scheduler=scheduler, launcher=launcher)
    parts = Parts(config=config, engine=engine)
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        backend.port = listeners[0].socket.getsockname()[1]
        launcher.url = f"http://127.0.0.1:{backend.port}"
        nursery.start_soon(trio.serve_listeners, backend.handle, listeners)
        await nursery.start(engine.run)
        binds = await nursery.start(
            functools.partial(serve_app, create_app(parts), "127.0.0.1", 0, server_config=server)
        )
        try:
            yield binds[0], engine, backend
        finally:
            nursery.cancel_scope.cancel()
            parts.pool.close_idle()


def _request(url: str, path: str) -> bytes:
    host = url.removeprefix("http://")
    return f"GET /backends/big/{path} HTTP/1.1\r\nhost: {host}\r\n\r\n".encode()


async def test_clients_that_stop_reading_give_their_backend_slots_back() -> None:
    server = ServerConfig(send_timeout_s=SEND_TIMEOUT_S)
    with trio.fail_after(20):
        async with _yard(server) as (url, engine, backend):
            port = int(url.rsplit(":", 1)[1])
            stalled: list[socket.socket] = []
            try:
                for _ in range(SLOTS):
                    # A client that reads nothing, with a small receive buffer.
                    client = socket.socket()
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    client.setblocking(False)
                    stalled.append(client)
                    sock = trio.socket.from_stdlib_socket(client)
                    await sock.connect(("127.0.0.1", port))
                    await sock.send(_request(url, "big"))
                # A ninth request: served once the stalled ones are cut.
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(_request(url, "ok"))
                    got = b""
                    while not got.endswith(b"ok"):
                        piece = await stream.receive_some(65536)
                        assert piece, got
                        got += piece
                assert got.startswith(b"HTTP/1.1 200 ")
                # Each stalled exchange was ended as a hang-up is: its upstream
                # call cut, and the engine told "cancelled".
                await backend.wait_cut(SLOTS)
                assert engine.statistics().requests.get("cancelled") == SLOTS
                assert engine.statistics().requests.get("ok") == 1
            finally:
                for client in stalled:
                    client.close()
