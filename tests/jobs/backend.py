"""A tiny in-process HTTP backend (h11 on Trio) for the jobs API tests.

- ``POST /v1/audio/speech``: ``audio_bytes(n)`` with ``n`` from the JSON
  body's ``"bytes"``, as ``audio/wav``, sent in 64 KiB pieces.
- ``POST /slow``: never answers (until the client goes away).
- ``POST /fail``: HTTP 500 with a JSON error.
- ``POST /bare``: HTTP 201, four bytes, no content type.
Records every request's path and ``x-yard-request-id``; counts hang-ups.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import partial

import h11
import trio


def audio_bytes(n: int) -> bytes:
    """``n`` deterministic bytes that look like nothing in particular (every
    byte value occurs), so that any corruption shows."""
    out = bytearray()
    block = b"yard"
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:n])


@dataclass
class Backend:
    port: int = 0
    seen: list[tuple[str, str]] = field(default_factory=list)
    hung_up: int = 0
    slow_started: trio.Event = field(default_factory=trio.Event)
    hung_up_event: trio.Event = field(default_factory=trio.Event)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _handle(backend: Backend, stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER)
    request: h11.Request | None = None
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            if not data:
                return
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            break
        else:
            return
    assert request is not None
    path = request.target.decode()
    job_id = dict(request.headers).get(b"x-yard-request-id", b"").decode()
    backend.seen.append((path, job_id))
    if path == "/slow":
        backend.slow_started.set()
        try:
            await stream.receive_some(1)  # returns b"" when the client hangs up
        finally:
            backend.hung_up += 1
            backend.hung_up_event.set()
        return
    if path == "/fail":
        status, content_type, payload = 500, b"application/json", b'{"error": "boom"}'
    elif path == "/bare":
        status, content_type, payload = 201, b"", b"\x00raw"
    else:
        n = int(json.loads(body)["bytes"])
        status, content_type, payload = 200, b"audio/wav", audio_bytes(n)
    headers = [
        *([(b"content-type", content_type)] if content_type else []),
        (b"content-length", b"%d" % len(payload)),
        (b"x-voice", b"alto"),
    ]
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
    for i in range(0, len(payload), 65536):
        await stream.send_all(conn.send(h11.Data(data=payload[i : i + 65536])) or b"")
    await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
    await stream.aclose()


async def serve_backend(
    backend: Backend, *, task_status: trio.TaskStatus[Backend] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve on a free loopback port until cancelled."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    backend.port = listeners[0].socket.getsockname()[1]
    task_status.started(backend)
    await trio.serve_listeners(partial(_handle, backend), listeners)
