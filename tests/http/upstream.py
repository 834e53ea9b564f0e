"""A small in-process backend for the proxy tests: trio + h11, loopback only.

What it does is chosen by the request path:

- ``/v1/...`` (POST, JSON): ``"stream": true`` streams ``chunks`` server-sent
  events ``interval`` seconds apart, else answers a JSON echo of the request.
- ``/status/NNN``: answers status NNN with a small JSON body.
- ``/cut-before``: closes the connection without answering.
- ``/cut-after``: sends the status line and one chunk, then closes.
- ``/hang``: sends headers and one chunk, then waits forever.
- anything else: the JSON echo.

The echo is ``{"method", "target", "headers", "body"}`` (body as text), so a
test sees exactly what reached the backend.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

import h11
import trio


@dataclass
class Upstream:
    """Counts and live state of the fake backend."""

    port: int = 0
    requests: list[h11.Request] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    open_streams: int = 0
    closed_streams: int = 0
    changed: trio.Event = field(default_factory=trio.Event)

    async def wait_streams_closed(self, count: int) -> None:
        """Wait until ``count`` streamed responses have ended (done or cut)."""
        while self.closed_streams < count:
            self.changed = trio.Event()
            await self.changed.wait()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _send(stream: trio.SocketStream, conn: h11.Connection, *events: h11.Event) -> None:
    data = b"".join(conn.send(e) or b"" for e in events)
    await stream.send_all(data)


async def _handle(state: Upstream, stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER)
    request: h11.Request | None = None
    body = b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
                continue
            if isinstance(event, h11.Request):
                request, body = event, b""
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                state.requests.append(request)
                state.bodies.append(body)
                if not await _respond(state, stream, conn, request, body):
                    return
                conn.start_next_cycle()
            else:
                return
    except (trio.BrokenResourceError, h11.RemoteProtocolError):
        return
    finally:
        await trio.aclose_forcefully(stream)


async def _respond(
    state: Upstream,
    stream: trio.SocketStream,
    conn: h11.Connection,
    request: h11.Request,
    body: bytes,
) -> bool:
    path = request.target.split(b"?")[0].decode()
    if path == "/cut-before":
        return False
    if path.startswith("/status/"):
        status = int(path.rsplit("/", 1)[1])
        payload = json.dumps({"backend_status": status}).encode()
        await _send(
            stream,
            conn,
            h11.Response(
                status_code=status,
                headers=[
                    ("content-type", "application/json"),
                    ("content-length", str(len(payload))),
                ],
            ),
            h11.Data(data=payload),
            h11.EndOfMessage(),
        )
        return True
    if path in ("/cut-after", "/hang"):
        await _send(
            stream,
            conn,
            h11.Response(status_code=200, headers=[("content-type", "text/plain")]),
            h11.Data(data=b"first"),
        )
        if path == "/hang":
            state.open_streams += 1
            try:
                await trio.sleep_forever()
            finally:
                state.open_streams -= 1
                state.closed_streams += 1
                state.changed.set()
        return False
    data: object = None
    if body:
        try:
            data = json.loads(body)
        except ValueError:
            data = None
    if isinstance(data, dict) and data.get("stream"):
        await _stream_events(state, stream, conn, data)
        return True
    payload = json.dumps(
        {
            "method": request.method.decode(),
            "target": request.target.decode(),
            "headers": [[k.decode(), v.decode()] for k, v in request.headers],
            "body": body.decode("utf-8", "replace"),
        }
    ).encode()
    await _send(
        stream,
        conn,
        h11.Response(
            status_code=200,
            headers=[
                ("content-type", "application/json"),
                ("content-length", str(len(payload))),
                ("x-backend", "fake"),
            ],
        ),
        h11.Data(data=payload),
        h11.EndOfMessage(),
    )
    return True


async def _stream_events(
    state: Upstream, stream: trio.SocketStream, conn: h11.Connection, data: dict[str, object]
) -> None:
    chunks = int(str(data.get("chunks", 3)))
    interval = float(str(data.get("interval", 0.0)))
    model = str(data.get("model", ""))
    await _send(
        stream,
        conn,
        # (llama-server, too, asks proxies not to buffer its streams.)
        h11.Response(
            status_code=200,
            headers=[("content-type", "text/event-stream"), ("x-accel-buffering", "no")],
        ),
    )
    state.open_streams += 1
    try:
        for i in range(chunks):
            chunk = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}],
            }
            await _send(
                stream, conn, h11.Data(data=b"data: " + json.dumps(chunk).encode() + b"\n\n")
            )
            if interval:
                await trio.sleep(interval)
        await _send(stream, conn, h11.Data(data=b"data: [DONE]\n\n"), h11.EndOfMessage())
    finally:
        state.open_streams -= 1
        state.closed_streams += 1
        state.changed.set()


async def serve_upstream(
    state: Upstream, *, task_status: trio.TaskStatus[Upstream] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the fake backend on a free loopback port until cancelled."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    state.port = listeners[0].socket.getsockname()[1]
    task_status.started(state)
    await trio.serve_listeners(functools.partial(_handle, state), listeners)


@dataclass
class Scripted:
    """A backend that answers every request with the same raw bytes, then
    closes the connection (for answers no real HTTP library would send)."""

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
