"""The fake HTTP backend of yard's tests and benchmark: h11 on Trio, loopback.

In-process, ``await nursery.start(serve_fake, FakeBackend())`` serves it on a
free port until cancelled; as a process, ``python -m yard.testing.fake --port
0`` prints ``listening on http://HOST:PORT`` once bound. It speaks HTTP with
h11, not with yard's own code, so that a bug in yard's HTTP cannot hide in
its fake. (A backend that is a real process, with memory, load times and
crashes on demand, is :mod:`yard.testing.backend`.)

What it answers is chosen by the request:

- ``GET /health``: 200.
- ``/status/NNN``: status NNN with a small JSON body.
- ``/cut-before``: closes the connection without answering.
- ``/cut-after``: the head and one chunk, then closes.
- ``/hang``: the head and one chunk, then waits until the client goes
  (``open_streams``, ``closed_streams``).
- ``/slow``: never answers; counts the client hanging up (``hung_up``).
- ``/fail``: 500 with a JSON error; ``/bare``: 201, four bytes, no type.
- ``POST /v1/audio/speech`` with a JSON ``"bytes": n``: ``audio_bytes(n)``
  as ``audio/wav``, in 64 KiB pieces.
- a JSON body with ``"stream": true``: ``"chunks"`` server-sent events
  (``chat.completion.chunk``) ``"interval"`` seconds apart, then ``[DONE]``.
- a path with ``stream`` in it (``/v1/stream?n=N&ms=M``): N events M ms
  apart, each carrying its send time (``time.time()``), so a client can
  tell whether chunks were held back on the way.
- anything else: with ``answer="echo"`` (the default) a JSON echo of
  ``method``, ``target``, ``headers`` and ``body`` (as text), so a test sees
  exactly what reached the backend; with ``answer="small"`` (the
  benchmark's) a fixed small chat completion.

Every request is recorded: ``requests`` (the h11 heads), ``bodies`` and
``seen`` (path and ``X-Yard-Request-Id``).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qs

import h11
import trio

from yard.testing.payloads import audio_bytes

_SMALL = (
    b'{"id":"cmpl-bench","object":"chat.completion",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'
)
_SMALL_HEAD = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(_SMALL))]
_JSON = b"application/json"
_PIECE = 65536


@dataclass
class FakeBackend:
    """What the fake answers with, what it saw, and its streams.

    answer: ``"echo"`` or ``"small"``, for requests no path picks out.
    port: the port it listens on, once it does.
    """

    answer: Literal["echo", "small"] = "echo"
    port: int = 0
    requests: list[h11.Request] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    seen: list[tuple[str, str]] = field(default_factory=list)
    open_streams: int = 0
    closed_streams: int = 0
    hung_up: int = 0
    changed: trio.Event = field(default_factory=trio.Event)
    slow_started: trio.Event = field(default_factory=trio.Event)
    hung_up_event: trio.Event = field(default_factory=trio.Event)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait_streams_closed(self, count: int) -> None:
        """Wait until ``count`` streamed responses have ended (done or cut)."""
        while self.closed_streams < count:
            self.changed = trio.Event()
            await self.changed.wait()

    def _stream_ended(self) -> None:
        self.open_streams -= 1
        self.closed_streams += 1
        self.changed.set()


class _Exchange:
    """One connection: the stream and its h11 state."""

    __slots__ = ("conn", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)

    async def send(self, *events: h11.Event) -> None:
        await self.stream.send_all(b"".join(self.conn.send(e) or b"" for e in events))

    async def answer(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes = b""
    ) -> None:
        head = [*headers, (b"content-length", b"%d" % len(body))]
        await self.send(h11.Response(status_code=status, headers=head))
        for start in range(0, len(body), _PIECE):
            await self.send(h11.Data(data=body[start : start + _PIECE]))
        await self.send(h11.EndOfMessage())


async def _handle(state: FakeBackend, stream: trio.SocketStream) -> None:
    exchange = _Exchange(stream)
    conn = exchange.conn
    request: h11.Request | None = None
    body = b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(_PIECE))
            elif isinstance(event, h11.Request):
                request, body = event, b""
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                if not await _respond(state, exchange, request, body):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
            else:
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
        return
    finally:
        await trio.aclose_forcefully(stream)


async def _respond(
    state: FakeBackend, exchange: _Exchange, request: h11.Request, body: bytes
) -> bool:
    """Answer one request; False when the connection must close."""
    target = request.target
    path = target.partition(b"?")[0].decode("latin-1")
    if state.answer == "small" and not path.startswith(("/status/", "/cut-", "/hang", "/slow")):
        # The benchmark's hot path: nothing recorded, nothing parsed.
        if "stream" in path:
            await _timed_stream(exchange, target)
        else:
            await exchange.stream.send_all(
                exchange.conn.send(h11.Response(status_code=200, headers=_SMALL_HEAD))
                + (exchange.conn.send(h11.Data(data=_SMALL)) or b"")
                + (exchange.conn.send(h11.EndOfMessage()) or b"")
            )
        return True
    state.requests.append(request)
    state.bodies.append(body)
    request_id = dict(request.headers).get(b"x-yard-request-id", b"").decode()
    state.seen.append((path, request_id))
    state.changed.set()
    if path == "/health":
        await exchange.answer(200, [(b"content-type", b"text/plain")], b"ok")
    elif path.startswith("/status/"):
        status = int(path.rsplit("/", 1)[1])
        payload = json.dumps({"backend_status": status}).encode()
        await exchange.answer(status, [(b"content-type", _JSON)], payload)
    elif path == "/cut-before":
        return False
    elif path in ("/cut-after", "/hang"):
        await exchange.send(
            h11.Response(status_code=200, headers=[(b"content-type", b"text/plain")]),
            h11.Data(data=b"first"),
        )
        if path == "/hang":
            state.open_streams += 1
            try:
                await trio.sleep_forever()
            finally:
                state._stream_ended()
        return False
    elif path == "/slow":
        state.slow_started.set()
        try:
            await exchange.stream.receive_some(1)  # b"" when the client hangs up
        finally:
            state.hung_up += 1
            state.hung_up_event.set()
        return False
    elif path == "/fail":
        headers = [(b"content-type", _JSON), (b"x-voice", b"alto")]
        await exchange.answer(500, headers, b'{"error": "boom"}')
    elif path == "/bare":
        await exchange.answer(201, [(b"x-voice", b"alto")], b"\x00raw")
    else:
        data = _json(body)
        if path == "/v1/audio/speech" and isinstance(data, dict) and "bytes" in data:
            headers = [(b"content-type", b"audio/wav"), (b"x-voice", b"alto")]
            await exchange.answer(200, headers, audio_bytes(int(data["bytes"])))
        elif isinstance(data, dict) and data.get("stream"):
            await _chat_stream(state, exchange, data)
        elif "stream" in path:
            await _timed_stream(exchange, target)
        elif state.answer == "small":
            await exchange.answer(200, [(b"content-type", _JSON)], _SMALL)
        else:
            await exchange.answer(
                200, [(b"content-type", _JSON), (b"x-backend", b"fake")], _echo(request, body)
            )
    return True


def _json(body: bytes) -> object:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def _echo(request: h11.Request, body: bytes) -> bytes:
    return json.dumps(
        {
            "method": request.method.decode(),
            "target": request.target.decode(),
            "headers": [[k.decode(), v.decode()] for k, v in request.headers],
            "body": body.decode("utf-8", "replace"),
        }
    ).encode()


async def _chat_stream(state: FakeBackend, exchange: _Exchange, data: dict[str, object]) -> None:
    chunks = int(str(data.get("chunks", 3)))
    interval = float(str(data.get("interval", 0.0)))
    model = str(data.get("model", ""))
    # (llama-server, too, asks proxies not to buffer its streams.)
    head = [(b"content-type", b"text/event-stream"), (b"x-accel-buffering", b"no")]
    await exchange.send(h11.Response(status_code=200, headers=head))
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
            await exchange.send(h11.Data(data=b"data: " + json.dumps(chunk).encode() + b"\n\n"))
            if interval:
                await trio.sleep(interval)
        await exchange.send(h11.Data(data=b"data: [DONE]\n\n"), h11.EndOfMessage())
    finally:
        state._stream_ended()


async def _timed_stream(exchange: _Exchange, target: bytes) -> None:
    query = parse_qs(target.partition(b"?")[2].decode())
    count = int(query.get("n", ["10"])[0])
    interval = float(query.get("ms", ["10"])[0]) / 1000.0
    head = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await exchange.send(h11.Response(status_code=200, headers=head))
    for i in range(count):
        if i:
            await trio.sleep(interval)
        await exchange.send(h11.Data(data=b'data: {"i":%d,"sent":%.6f}\n\n' % (i, time.time())))
    await exchange.send(h11.EndOfMessage())


async def serve_fake(
    state: FakeBackend,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[FakeBackend] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the fake on ``host:port`` (0: a free port, in ``state.port``)
    until cancelled."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    state.port = listeners[0].socket.getsockname()[1]
    task_status.started(state)
    await trio.serve_listeners(functools.partial(_handle, state), listeners)


def main(argv: list[str] | None = None) -> int:
    """``python -m yard.testing.fake [--host H] [--port P] [--answer small|echo]``."""
    parser = argparse.ArgumentParser(prog="python -m yard.testing.fake")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--answer", choices=("small", "echo"), default="small")
    args = parser.parse_args(argv)
    state = FakeBackend(answer=args.answer)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                functools.partial(serve_fake, state, host=args.host, port=args.port)
            )
            print(f"listening on http://{args.host}:{state.port}", flush=True)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
