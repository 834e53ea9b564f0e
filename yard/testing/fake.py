"""The fake HTTP backend of yard's tests and benchmarks: h11 on Trio, loopback.

One fake serves every test: in-process, ``await nursery.start(serve_fake,
FakeBackend())`` serves it on a free port until cancelled; as a process,
``python -m yard.testing.backend`` (a model server: real memory, load times,
failures on demand; see :mod:`yard.testing.backend`) or ``python -m
yard.testing.fake --port 0`` (the benchmark's small answers) print
``listening on http://HOST:PORT`` once bound. It speaks HTTP with h11, not
with yard's own code, so that a bug in yard's HTTP cannot hide in its fake.

What it answers is chosen by the request:

- ``GET /health``: 200 ``{"status": "ok"}``; 503 ``Loading model`` while
  loading (as llama-server does); 500 forever with ``fail_health``.
- ``GET /props``: llama-server's context and slots with ``gpu_file``
  (:meth:`FakeBackend.props`), else 404 from the model server
  (``answer="openai"``) as from other servers; the echo echoes it.
- ``/status/NNN``: status NNN with a small JSON body.
- ``/cut-before``: closes the connection without answering.
- ``/cut-after``: the head and one chunk, then closes.
- ``/hang``: the head and one chunk, then waits until the client goes
  (``open_streams``, ``closed_streams``).
- ``/slow``: never answers; counts the client hanging up (``hung_up``).
- ``/fail``: 500 with a JSON error; ``/bare``: 201, four bytes, no type.
- a path with ``stream`` in it (``/v1/stream?n=N&ms=M``): N events M ms
  apart, each carrying its send time (``time.time()``), so a client can
  tell whether chunks were held back on the way.
- any other request is an API request. The failure switches act on it first
  (``crash_after``, ``hang``, ``garbage``, ``grow_after_first``,
  ``service_time``), then:

  * a JSON body with ``"stream": true``: server-sent completion chunks
    (``"chunks"`` of them, ``"interval"`` seconds apart; the options'
    ``chunks`` and ``chunk_interval`` when the body does not say), a final
    chunk, then ``[DONE]``;
  * ``POST /v1/audio/speech`` with a JSON ``"bytes": n``: ``audio_bytes(n)``
    as ``audio/wav``, in 64 KiB pieces;
  * with ``answer="openai"`` (the process backend's), what a model server
    answers: ``GET /v1/models``, chat and text completions, embeddings,
    images (a real PNG, base64 in JSON), speech (a real WAV),
    transcriptions (multipart in, text out);
  * with ``answer="small"`` (the benchmark's), a fixed small chat
    completion, on a path that records and parses nothing;
  * else a JSON echo of ``method``, ``target``, ``path``, ``query``,
    ``headers`` (pairs, as sent) and ``body`` (as text), so that a test sees
    exactly what reached the backend.

Every answer carries ``x-test-backend-pid``. Every request is recorded,
unless ``record`` is off: ``requests`` (the h11 heads), ``bodies`` and
``seen`` (path and ``X-Yard-Request-Id``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, urlsplit

import h11
import trio

from yard.testing.payloads import (
    audio_bytes,
    completion,
    completion_chunk,
    embeddings,
    images,
    wav_bytes,
)

Answer = Literal["echo", "small", "openai"]

PAGE = 4096
MAX_BODY = 256 * 2**20
_PIECE = 65536
_JSON = b"application/json"
_PID = (b"x-test-backend-pid", str(os.getpid()).encode())
_SMALL = (
    b'{"id":"cmpl-bench","object":"chat.completion",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'
)
_SMALL_HEAD = [(b"content-type", _JSON), (b"content-length", b"%d" % len(_SMALL)), _PID]
# Paths that mean the same in every answer mode (the benchmark's hot path
# leaves them to the full responder).
_SPECIAL = ("/status/", "/cut-", "/hang", "/slow")


@dataclass(slots=True, kw_only=True)
class Options:
    """How the fake behaves: what it answers, and its switches (a process's
    command-line switches, see :mod:`yard.testing.backend`)."""

    answer: Answer = "echo"
    record: bool = True
    host: str = "127.0.0.1"
    port: int = 0
    models: list[str] = field(default_factory=lambda: ["test-model"])
    load_time: float = 0.0
    slow_start: float = 0.0
    memory: int = 0
    grow_after_first: int = 0
    service_time: float = 0.0
    chunks: int = 5
    chunk_interval: float = 0.05
    crash_after: int | None = None
    oom: bool = False
    hang: bool = False
    fail_health: bool = False
    garbage: bool = False
    counter_file: str | None = None
    ignore_sigterm: bool = False
    child: bool = False
    embedding_dim: int = 8
    gpu_file: str | None = None
    model_file: str | None = None
    context: int | None = None
    parallel: int = 1
    skew: float = 1.0
    oom_stays_up: bool = False


@dataclass(slots=True)
class Request:
    """A request as the fake read it (headers by lower-case name)."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    head: h11.Request

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    def json(self) -> dict[str, object]:
        """The body as a JSON object; ``{}`` when it is not one."""
        try:
            value = json.loads(self.body or b"{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


def touch(size: int) -> bytearray:
    """``size`` bytes, every page written, so that they are really resident."""
    buf = bytearray(size)
    if size:
        buf[::PAGE] = b"\x01" * len(range(0, size, PAGE))
    return buf


class _Hangup(Exception):
    """Stop talking on this connection."""


class FakeBackend:
    """The fake: its options, what it saw, and its streams.

    Args:
        options: its switches (default: an in-process echo, ready at once).
        answer: shorthand for ``options.answer``.
    """

    def __init__(self, options: Options | None = None, *, answer: Answer | None = None) -> None:
        self.options = options or Options()
        if answer is not None:
            self.options.answer = answer
        #: The port it listens on, once it does.
        self.port = 0
        self.requests: list[h11.Request] = []
        self.bodies: list[bytes] = []
        self.seen: list[tuple[str, str]] = []
        self.open_streams = 0
        self.closed_streams = 0
        self.hung_up = 0
        self.changed = trio.Event()
        self.slow_started = trio.Event()
        self.hung_up_event = trio.Event()
        #: Loaded (health answers 200); see :meth:`load`.
        self.ready = not (self.options.load_time or self.options.memory)
        self.started = 0  # API requests started
        self.served = 0  # API requests answered
        self.held: list[bytearray] = []
        self.grown = False
        self.trained_context: int | None = None

    @property
    def answer(self) -> Answer:
        return self.options.answer

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

    # -- lifecycle -------------------------------------------------------------

    async def load(self) -> None:
        """Load: hold ``memory``, take ``load_time``, then be ready (prints
        ``ready``). With ``oom`` and no ``crash_after``, die of it instead."""
        t0 = trio.current_time()
        if self.options.memory:
            self.held.append(await trio.to_thread.run_sync(touch, self.options.memory))
        if self.options.gpu_file is not None and not self._allocate_on_gpu():
            if self.options.oom_stays_up:
                await trio.sleep_forever()  # health stays 503, as llama-server's may
            os._exit(1)
        await trio.sleep_until(t0 + self.options.load_time)
        if self.options.oom and self.options.crash_after is None:
            self.die(oom=True)
        self.ready = True
        print("ready", flush=True)

    def _allocate_on_gpu(self) -> bool:
        """Take what llama-server would at ``context`` from the shared fake
        card (:mod:`yard.testing.gpu`): the estimate from ``model_file``
        (:func:`yard.memory.prior.estimate`) times ``skew`` (a real server
        may need more than the estimate). False, after llama.cpp's own
        out-of-memory lines on stderr, when it does not fit."""
        from yard.memory.prior import estimate, read_model_file
        from yard.testing.gpu import CudaOutOfMemory, SharedGpu, llama_oom_lines

        o = self.options
        assert o.gpu_file is not None and o.model_file is not None
        model = read_model_file(Path(o.model_file))
        self.trained_context = model.trained_context
        need = estimate(model, o.context, on_gpu=True).gpu_bytes
        wanted = int(need * o.skew)
        try:
            SharedGpu(Path(o.gpu_file)).allocate(os.getpid(), wanted)
        except CudaOutOfMemory:
            for line in llama_oom_lines(wanted, o.model_file):
                print(line, file=sys.stderr, flush=True)
            return False
        return True

    def props(self) -> dict[str, object]:
        """llama-server's ``/props``: a slot's context (capped at the trained
        one) and the slots."""
        context = self.options.context or 4096
        if self.trained_context is not None:
            context = min(context, self.trained_context)
        return {
            "default_generation_settings": {"n_ctx": context},
            "total_slots": self.options.parallel,
        }

    def die(self, *, oom: bool) -> None:
        """Exit abruptly, as a crash (code 3) or a GPU out-of-memory (code 1)."""
        if oom:
            print("CUDA error: out of memory", file=sys.stderr, flush=True)
            os._exit(1)
        print("crashing on purpose (--crash-after)", file=sys.stderr, flush=True)
        os._exit(3)

    # -- HTTP ------------------------------------------------------------------

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        """Serve requests on ``stream`` until either side closes it."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        try:
            while True:
                request = await self._read_request(stream, conn)
                if request is None or not await self.respond(stream, conn, request):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError, _Hangup):
            return
        finally:
            await trio.aclose_forcefully(stream)

    async def _read_request(
        self, stream: trio.SocketStream, conn: h11.Connection
    ) -> Request | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(_PIECE)))
            elif isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise _Hangup
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return Request(
                    method=head.method.decode(),
                    target=head.target.decode(),
                    headers={k.decode(): v.decode("latin-1") for k, v in head.headers},
                    body=bytes(body),
                    head=head,
                )
            else:
                return None

    async def send(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        status: int,
        body: bytes,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """A whole answer: ``headers`` (default: JSON), ``body`` in 64 KiB pieces."""
        head = [*(headers or [(b"content-type", _JSON)]), (b"content-length", b"%d" % len(body))]
        await stream.send_all(conn.send(h11.Response(status_code=status, headers=[*head, _PID])))
        for start in range(0, len(body), _PIECE):
            await stream.send_all(conn.send(h11.Data(data=body[start : start + _PIECE])) or b"")
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")

    async def send_json(
        self, stream: trio.SocketStream, conn: h11.Connection, status: int, value: object
    ) -> None:
        await self.send(stream, conn, status, json.dumps(value).encode())

    async def respond(self, stream: trio.SocketStream, conn: h11.Connection, req: Request) -> bool:
        """Answer one request; False when the connection must close."""
        path = req.path
        if self.answer == "small" and not path.startswith(_SPECIAL):
            # The benchmark's hot path: nothing recorded, nothing parsed.
            if "stream" in path:
                await _timed_stream(stream, conn, req.target)
            else:
                await stream.send_all(
                    conn.send(h11.Response(status_code=200, headers=_SMALL_HEAD))
                    + (conn.send(h11.Data(data=_SMALL)) or b"")
                    + (conn.send(h11.EndOfMessage()) or b"")
                )
            return True
        if self.options.record:
            self.requests.append(req.head)
            self.bodies.append(req.body)
            self.seen.append((path, req.headers.get("x-yard-request-id", "")))
            self.changed.set()
        if path == "/health":
            if self.options.fail_health:
                await self.send_json(stream, conn, 500, _error("health check fails on purpose"))
            elif not self.ready:
                await self.send_json(stream, conn, 503, _error("Loading model", code=503))
            else:
                await self.send_json(stream, conn, 200, {"status": "ok"})
        elif path == "/props" and (self.options.gpu_file is not None or self.answer == "openai"):
            # llama-server's page; other model servers have none (yard asks
            # every one once ready); the echo answers it as any other path
            if self.options.gpu_file is not None:
                await self.send_json(stream, conn, 200, self.props())
            else:
                await self.send_json(stream, conn, 404, _error("File Not Found", code=404))
        elif path.startswith("/status/"):
            status = int(path.rsplit("/", 1)[1])
            await self.send_json(stream, conn, status, {"backend_status": status})
        elif path == "/cut-before":
            return False
        elif path in ("/cut-after", "/hang"):
            head = [(b"content-type", b"text/plain"), _PID]
            await stream.send_all(
                conn.send(h11.Response(status_code=200, headers=head))
                + (conn.send(h11.Data(data=b"first")) or b"")
            )
            if path == "/hang":
                self.open_streams += 1
                try:
                    await trio.sleep_forever()
                finally:
                    self._stream_ended()
            return False
        elif path == "/slow":
            self.slow_started.set()
            try:
                await stream.receive_some(1)  # b"" when the client hangs up
            finally:
                self.hung_up += 1
                self.hung_up_event.set()
            return False
        elif path == "/fail":
            headers = [(b"content-type", _JSON), (b"x-voice", b"alto")]
            await self.send(stream, conn, 500, b'{"error": "boom"}', headers)
        elif path == "/bare":
            await self.send(stream, conn, 201, b"\x00raw", [(b"x-voice", b"alto")])
        elif "stream" in path:
            await _timed_stream(stream, conn, req.target)
        elif self.answer == "openai" and path == "/v1/models" and req.method == "GET":
            models = [
                {"id": m, "object": "model", "created": 0, "owned_by": "yard-test"}
                for m in self.options.models
            ]
            await self.send_json(stream, conn, 200, {"object": "list", "data": models})
        else:
            await self.api(stream, conn, req)
        return True

    async def api(self, stream: trio.SocketStream, conn: h11.Connection, req: Request) -> None:
        """Answer an API request, the failure switches first."""
        o = self.options
        number = self.started
        self.started += 1
        if o.crash_after is not None and number >= o.crash_after:
            # Mid-request: the request was read, nothing of the answer was sent.
            await trio.sleep(o.service_time / 2)
            self.die(oom=o.oom)
        if o.hang:
            await trio.sleep_forever()
        if o.garbage:
            await stream.send_all(b"\x00\xffTHIS IS NOT HTTP\r\n\x01\x02\r\n\r\n")
            raise _Hangup
        if o.grow_after_first and not self.grown:
            self.grown = True
            self.held.append(await trio.to_thread.run_sync(touch, o.grow_after_first))
        await trio.sleep(o.service_time)
        body = req.json()
        if body.get("stream"):
            await self._stream_completion(stream, conn, req, body)
            return
        if req.path == "/v1/audio/speech" and "bytes" in body:
            headers = [(b"content-type", b"audio/wav"), (b"x-voice", b"alto")]
            answer = audio_bytes(int(str(body["bytes"])))
        elif req.path == "/v1/audio/speech" and self.answer == "openai":
            headers, answer = [(b"content-type", b"audio/wav")], wav_bytes()
        else:
            payload = self._model_answer(req, body) if self.answer == "openai" else None
            if payload is None:
                headers, payload = [(b"content-type", _JSON), (b"x-backend", b"fake")], _echo(req)
            else:
                headers = [(b"content-type", _JSON)]
            answer = json.dumps(payload).encode()
        # Counted before the answer leaves, so that whoever reads the answer
        # and then kills the process finds it in the counter file.
        self.count(req)
        await self.send(stream, conn, 200, answer, headers)

    def _model_answer(self, req: Request, body: dict[str, object]) -> object | None:
        """What a model server answers to a POST on one of its paths, else None."""
        if req.method != "POST":
            return None
        model = str(body.get("model") or self.options.models[0])
        path = req.path
        if path in ("/v1/chat/completions", "/v1/completions"):
            return completion(model, body, chat=path == "/v1/chat/completions")
        if path == "/v1/embeddings":
            return embeddings(model, body.get("input", ""), self.options.embedding_dim)
        if path == "/v1/images/generations":
            return images(body)
        if path == "/v1/audio/transcriptions":
            return {"text": f"transcribed {len(req.body)} bytes"}
        return None

    async def _stream_completion(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        req: Request,
        body: dict[str, object],
    ) -> None:
        chat = req.path != "/v1/completions"
        model = str(body.get("model") or self.options.models[0])
        chunks = int(str(body.get("chunks", self.options.chunks)))
        interval = float(str(body.get("interval", self.options.chunk_interval)))
        # (llama-server, too, asks proxies not to buffer its streams.)
        head = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            _PID,
        ]
        await stream.send_all(conn.send(h11.Response(status_code=200, headers=head)))
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{os.getpid()}-{self.started}"
        self.open_streams += 1
        try:
            for i in range(chunks):
                if i:
                    await trio.sleep(interval)
                chunk = completion_chunk(ident, model, f"tok{i} ", chat=chat)
                await stream.send_all(conn.send(h11.Data(data=_event(chunk))) or b"")
            self.count(req)
            final = completion_chunk(ident, model, None, chat=chat)
            done = _event(final) + b"data: [DONE]\n\n"
            await stream.send_all(
                (conn.send(h11.Data(data=done)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
            )
        finally:
            self._stream_ended()

    def count(self, req: Request) -> None:
        """One more API request answered (and its id in ``counter_file``)."""
        self.served += 1
        if self.options.counter_file:
            ident = (
                req.headers.get("x-yard-request-id")
                or req.headers.get("x-request-id")
                or f"req-{self.served}"
            )
            with open(self.options.counter_file, "a") as f:
                f.write(ident + "\n")


def _event(value: object) -> bytes:
    return b"data: " + json.dumps(value).encode() + b"\n\n"


def _error(message: str, code: int | str = "error") -> dict[str, object]:
    return {"error": {"message": message, "type": "server_error", "code": code}}


def _echo(req: Request) -> dict[str, object]:
    return {
        "method": req.method,
        "target": req.target,
        "path": req.path,
        "query": parse_qs(urlsplit(req.target).query),
        "headers": [[k.decode(), v.decode("latin-1")] for k, v in req.head.headers],
        "body": req.body.decode("utf-8", "replace"),
        "pid": os.getpid(),
    }


async def _timed_stream(stream: trio.SocketStream, conn: h11.Connection, target: str) -> None:
    query = parse_qs(urlsplit(target).query)
    count = int(query.get("n", ["10"])[0])
    interval = float(query.get("ms", ["10"])[0]) / 1000.0
    head = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), _PID]
    await stream.send_all(conn.send(h11.Response(status_code=200, headers=head)))
    for i in range(count):
        if i:
            await trio.sleep(interval)
        data = b'data: {"i":%d,"sent":%.6f}\n\n' % (i, time.time())
        await stream.send_all(conn.send(h11.Data(data=data)) or b"")
    await stream.send_all(conn.send(h11.EndOfMessage()) or b"")


async def serve_fake(
    state: FakeBackend,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[FakeBackend] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the fake on ``host:port`` (0: a free port, in ``state.port``)
    until cancelled; it loads (:meth:`FakeBackend.load`) meanwhile if its
    options ask for memory or a load time."""
    listeners = await trio.open_tcp_listeners(port, host=host, backlog=128)
    state.port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        if not state.ready:
            nursery.start_soon(state.load)
        task_status.started(state)
        await trio.serve_listeners(state.serve_connection, listeners)


def main(argv: list[str] | None = None) -> int:
    """``python -m yard.testing.fake [--host H] [--port P] [--answer small|echo|openai]``."""
    parser = argparse.ArgumentParser(prog="python -m yard.testing.fake")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--answer", choices=("small", "echo", "openai"), default="small")
    args = parser.parse_args(argv)
    state = FakeBackend(Options(answer=args.answer, record=False))

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
