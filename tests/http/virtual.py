"""The gateway on virtual time. Clients: loopback TCP pairs handed straight to
yard's :class:`~yard.h1.server.Server` (no listener), read with h11, so that
a test under MockClock sees every piece of a response at its exact virtual
time (the server watches its sockets, so the pair is TCP, not a memory
stream). Backends: scripted fake processes whose HTTP is an in-process
backend (:class:`ServedLauncher`), for the real engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import h11
import trio

from yard.app.web import Parts
from yard.h1.server import Server
from yard.testing.fake import FakeBackend
from yard.testing.ports import FakeLauncher, FakeProcess, Script

E = TypeVar("E")


async def tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """A connected loopback TCP pair: (the server's end, the client's end)."""
    listener = trio.socket.socket()
    with listener:
        await listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = trio.socket.socket()
        await client.connect(listener.getsockname())
        server_end, _ = await listener.accept()
    return trio.SocketStream(server_end), trio.SocketStream(client)


@dataclass
class Reply:
    """A response as the client saw it, with the virtual time of each piece."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes = b""
    #: (virtual time, bytes) of each piece of the body as it arrived.
    pieces: list[tuple[float, bytes]] = field(default_factory=list)
    #: The response ended cleanly (not cut).
    complete: bool = False

    def header(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]


@dataclass
class VirtualGateway(Generic[E]):
    """The gateway on :class:`~yard.h1.server.Server`, reached through
    loopback TCP pairs handed to :meth:`Server.handle` (see ``vgw``)."""

    server: Server
    nursery: trio.Nursery
    engine: E
    upstream: FakeBackend
    parts: Parts
    clients: list[trio.SocketStream] = field(default_factory=list)

    async def open(
        self, method: str, path: str, body: bytes = b"", headers: Sequence[tuple[str, str]] = ()
    ) -> trio.SocketStream:
        """A new connection with one request written on it."""
        server_end, client = await tcp_pair()
        self.clients.append(client)
        self.nursery.start_soon(self.server.handle, server_end)
        head = [("host", "127.0.0.1"), ("content-length", str(len(body))), *headers]
        await client.send_all(
            f"{method} {path} HTTP/1.1\r\n".encode()
            + b"".join(f"{k}: {v}\r\n".encode() for k, v in head)
            + b"\r\n"
            + body
        )
        return client

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: Sequence[tuple[str, str]] = ()
    ) -> Reply:
        """One request; its response read (with h11) to the end or the cut."""
        stream = await self.open(method, path, body, headers)
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method=method, target=path, headers=[("host", "127.0.0.1")]))
        conn.send(h11.EndOfMessage())
        reply: Reply | None = None
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    headers_in = [(k.decode(), v.decode()) for k, v in event.headers]
                    reply = Reply(event.status_code, headers_in)
                elif isinstance(event, h11.Data):
                    assert reply is not None
                    reply.body += event.data
                    reply.pieces.append((trio.current_time(), bytes(event.data)))
                elif isinstance(event, h11.EndOfMessage):
                    assert reply is not None
                    reply.complete = True
                    return reply
        except (h11.RemoteProtocolError, trio.BrokenResourceError):
            assert reply is not None, "no response at all"
            return reply
        finally:
            await stream.aclose()


class ServedProcess(FakeProcess):
    """A scripted backend process whose HTTP is an in-process fake backend."""

    def __init__(self, url: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.url = url

    @property
    def base_url(self) -> str:
        return self.url


class ServedLauncher(FakeLauncher):
    """Launches scripted processes (load times, exits: :class:`Script`) that
    all answer at ``url`` (an in-process backend; it may be set once that
    listens, before the first launch)."""

    def __init__(self, url: str = "", scripts: Mapping[str, Script] | None = None) -> None:
        super().__init__(scripts)
        self.url = url

    async def launch(self, backend: str, gpus: tuple[str, ...], **options: Any) -> FakeProcess:
        """As :meth:`FakeLauncher.launch`, with the process answering at ``url``."""
        scripted = await super().launch(backend, gpus, **options)
        process = ServedProcess(self.url, backend, gpus, scripted.script, pid=scripted.pid or 0)
        self.processes[-1] = process
        return process
