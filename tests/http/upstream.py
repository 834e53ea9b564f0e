"""A scripted backend for the proxy tests: it answers every request with the
same raw bytes, whatever they are (for answers no HTTP library would send).
The well-behaved fake backend is :mod:`yard.testing.fake`."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import trio


@dataclass
class Scripted:
    """A backend that answers every request with the same raw bytes, then
    closes the connection."""

    answer: bytes
    port: int = 0
    requests: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _scripted(state: Scripted, stream: trio.SocketStream) -> None:
    try:
        received = b""
        while b"\r\n\r\n" not in received:
            data = await stream.receive_some(65536)
            if not data:
                return
            received += data
        state.requests += 1
        await stream.send_all(state.answer)
    except trio.BrokenResourceError:
        return
    finally:
        await trio.aclose_forcefully(stream)


async def serve_scripted(
    state: Scripted, *, task_status: trio.TaskStatus[Scripted] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the scripted answer on a free loopback port until cancelled."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    state.port = listeners[0].socket.getsockname()[1]
    task_status.started(state)
    await trio.serve_listeners(functools.partial(_scripted, state), listeners)
