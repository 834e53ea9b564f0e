"""A test backend: a real process, real HTTP, real memory, failures on demand.

``python -m yard.testing.backend --port 0 --load-time 1 --memory 512MiB``

It speaks enough of the OpenAI API for yard's proxy, jobs and benchmarks:

- ``GET /health``: 503 ``Loading model`` while loading (as llama-server
  does), then 200.
- ``GET /v1/models``; ``POST /v1/chat/completions`` and ``/v1/completions``
  (JSON, or server-sent events with ``"stream": true``: ``--chunks`` chunks,
  ``--chunk-interval`` apart); ``/v1/embeddings``; ``/v1/images/generations``
  (a real PNG, base64 in JSON); ``/v1/audio/speech`` (a real WAV);
  ``/v1/audio/transcriptions`` (multipart in, text out).
- Any other path: an echo of method, path, query, headers and body (for
  ``api = "plain"`` backends).

Switches (sizes accept ``"512MiB"`` etc.):

- ``--load-time S``: answer 503 on /health for S seconds after binding.
- ``--slow-start S``: wait S seconds before even binding the port.
- ``--memory SIZE``: allocate SIZE bytes while loading, touch every page, and
  hold them until exit (resident memory, measurable with psutil).
- ``--grow-after-first SIZE``: allocate SIZE more while serving the first
  API request.
- ``--service-time S``: each API request takes S seconds (streams: the time
  before the first chunk).
- ``--crash-after N``: serve N API requests, then exit abruptly (code 3) in
  the middle of the next one, before answering it.
- ``--oom``: crashes look like a GPU out-of-memory: ``CUDA error: out of
  memory`` on stderr, exit code 1. Without ``--crash-after`` it dies so at
  the end of loading.
- ``--hang``: API requests are read and never answered (health still
  answers: stuck, but alive).
- ``--fail-health``: /health answers 500 forever (it never becomes ready).
- ``--garbage``: API requests get bytes that are not HTTP.
- ``--counter-file PATH``: append the id of every served API request, one a
  line (``X-Yard-Request-Id``, else ``X-Request-Id``, else ``req-N``).
- ``--ignore-sigterm``: ignore SIGTERM (only SIGKILL stops it).
- ``--child``: start a child process that sleeps forever in the same process
  group (to test that the whole group is stopped).

It prints ``listening on http://HOST:PORT`` on stdout once bound, and
``ready`` once loaded.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

import h11
import trio

from yard.config import parse_size
from yard.testing.payloads import embedding, png_bytes, wav_bytes

PAGE = 4096
MAX_BODY = 256 * 2**20


def backend_command(**switches: object) -> list[str]:
    """The argv that starts the test backend, e.g.
    ``backend_command(load_time=0.5, memory="64MiB", crash_after=3)``.

    Keyword names are the switches with ``_`` for ``-``; True adds a bare
    flag, False/None leave it out, lists repeat the switch. Two are special:
    ``port`` defaults to the ``{port}`` placeholder of a yard config, and
    ``python`` (the interpreter) to this one.
    """
    port = switches.pop("port", "{port}")
    python = switches.pop("python", None)
    argv = [str(python or sys.executable), "-m", "yard.testing.backend", "--port", str(port)]
    for name, value in switches.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, list | tuple):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


@dataclass(slots=True, kw_only=True)
class Options:
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


def _size(text: str) -> int:
    try:
        return parse_size(int(text) if text.isdigit() else text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m yard.testing.backend",
        description="A test backend for yard: OpenAI-ish HTTP, real memory, failures on demand.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    p.add_argument("--model", dest="models", action="append", help="model name (repeatable)")
    p.add_argument("--load-time", type=float, default=0.0)
    p.add_argument("--slow-start", type=float, default=0.0)
    p.add_argument("--memory", type=_size, default=0)
    p.add_argument("--grow-after-first", type=_size, default=0)
    p.add_argument("--service-time", type=float, default=0.0)
    p.add_argument("--chunks", type=int, default=5)
    p.add_argument("--chunk-interval", type=float, default=0.05)
    p.add_argument("--crash-after", type=int, default=None)
    p.add_argument("--oom", action="store_true")
    p.add_argument("--hang", action="store_true")
    p.add_argument("--fail-health", action="store_true")
    p.add_argument("--garbage", action="store_true")
    p.add_argument("--counter-file", default=None)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--child", action="store_true")
    p.add_argument("--embedding-dim", type=int, default=8)
    ns = p.parse_args(list(argv))
    options = Options(**{k: v for k, v in vars(ns).items() if v is not None})
    return options


def touch(size: int) -> bytearray:
    """``size`` bytes, every page written, so that they are really resident."""
    buf = bytearray(size)
    if size:
        buf[::PAGE] = b"\x01" * len(range(0, size, PAGE))
    return buf


# -- the server -----------------------------------------------------------------


class Hangup(Exception):
    """Stop talking on this connection (used by --hang and --garbage)."""


@dataclass(slots=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    def json(self) -> dict[str, object]:
        try:
            value = json.loads(self.body or b"{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


class Backend:
    def __init__(self, options: Options) -> None:
        self.o = options
        self.ready = False
        self.started = 0  # API requests started
        self.served = 0  # API requests answered
        self.held: list[bytearray] = []
        self.grown = False

    # lifecycle

    async def load(self) -> None:
        t0 = trio.current_time()
        if self.o.memory:
            self.held.append(await trio.to_thread.run_sync(touch, self.o.memory))
        await trio.sleep_until(t0 + self.o.load_time)
        if self.o.oom and self.o.crash_after is None:
            self.die(oom=True)
        self.ready = True
        print("ready", flush=True)

    def die(self, *, oom: bool) -> None:
        if oom:
            print("CUDA error: out of memory", file=sys.stderr, flush=True)
            os._exit(1)
        print("crashing on purpose (--crash-after)", file=sys.stderr, flush=True)
        os._exit(3)

    # HTTP

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        try:
            while True:
                request = await self._read_request(stream, conn)
                if request is None:
                    return
                await self.respond(stream, conn, request)
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError, Hangup):
            return
        finally:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()

    async def _read_request(
        self, stream: trio.SocketStream, conn: h11.Connection
    ) -> Request | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise Hangup
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return Request(
                    method=head.method.decode(),
                    target=head.target.decode(),
                    headers={k.decode().lower(): v.decode("latin-1") for k, v in head.headers},
                    body=bytes(body),
                )
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None

    async def send(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        status: int,
        body: bytes,
        content_type: str = "application/json",
    ) -> None:
        headers = [
            ("content-type", content_type),
            ("content-length", str(len(body))),
            ("x-test-backend-pid", str(os.getpid())),
        ]
        data = (
            conn.send(h11.Response(status_code=status, headers=headers, reason=_reason(status)))
            or b""
        )
        data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(data)

    async def send_json(
        self, stream: trio.SocketStream, conn: h11.Connection, status: int, value: object
    ) -> None:
        await self.send(stream, conn, status, json.dumps(value).encode())

    async def respond(self, stream: trio.SocketStream, conn: h11.Connection, req: Request) -> None:
        if req.path == "/health":
            if self.o.fail_health:
                await self.send_json(stream, conn, 500, _error("health check fails on purpose"))
            elif not self.ready:
                await self.send_json(stream, conn, 503, _error("Loading model", code=503))
            else:
                await self.send_json(stream, conn, 200, {"status": "ok"})
            return
        if req.path == "/v1/models" and req.method == "GET":
            await self.send_json(
                stream,
                conn,
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": m, "object": "model", "created": 0, "owned_by": "yard-test"}
                        for m in self.o.models
                    ],
                },
            )
            return
        await self.api(stream, conn, req)

    async def api(self, stream: trio.SocketStream, conn: h11.Connection, req: Request) -> None:
        number = self.started
        self.started += 1
        if self.o.crash_after is not None and number >= self.o.crash_after:
            # Mid-request: the request was read, nothing of the answer was sent.
            await trio.sleep(self.o.service_time / 2)
            self.die(oom=self.o.oom)
        if self.o.hang:
            await trio.sleep_forever()
        if self.o.garbage:
            await stream.send_all(b"\x00\xffTHIS IS NOT HTTP\r\n\x01\x02\r\n\r\n")
            raise Hangup
        if self.o.grow_after_first and not self.grown:
            self.grown = True
            self.held.append(await trio.to_thread.run_sync(touch, self.o.grow_after_first))
        body = req.json()
        path = req.path
        model = str(body.get("model") or self.o.models[0])
        await trio.sleep(self.o.service_time)
        if req.method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            chat = path == "/v1/chat/completions"
            if body.get("stream"):
                await self.stream_completion(stream, conn, req, model, chat=chat)
                return
            payload: object = _completion(model, body, chat=chat)
        elif req.method == "POST" and path == "/v1/embeddings":
            inputs = body.get("input", "")
            texts = inputs if isinstance(inputs, list) else [inputs]
            payload = {
                "object": "list",
                "model": model,
                "data": [
                    {
                        "object": "embedding",
                        "index": i,
                        "embedding": embedding(str(t), self.o.embedding_dim),
                    }
                    for i, t in enumerate(texts)
                ],
                "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)},
            }
        elif req.method == "POST" and path == "/v1/images/generations":
            width, height = _image_size(str(body.get("size", "64x64")))
            n = max(1, min(4, _int(body.get("n"), 1)))
            prompt = str(body.get("prompt", ""))
            images = [
                {
                    "b64_json": base64.b64encode(
                        png_bytes(width, height, f"{prompt}{i}".encode())
                    ).decode()
                }
                for i in range(n)
            ]
            payload = {"created": int(time.time()), "data": images}
        elif req.method == "POST" and path == "/v1/audio/speech":
            self.count(req)
            await self.send(stream, conn, 200, wav_bytes(), content_type="audio/wav")
            return
        elif req.method == "POST" and path == "/v1/audio/transcriptions":
            payload = {"text": f"transcribed {len(req.body)} bytes"}
        else:
            payload = {
                "method": req.method,
                "path": path,
                "query": parse_qs(urlsplit(req.target).query),
                "headers": req.headers,
                "body": req.body.decode("utf-8", "replace"),
                "pid": os.getpid(),
            }
        # Counted before the answer leaves, so that whoever reads the answer
        # and then kills the process finds it in the counter file.
        self.count(req)
        await self.send_json(stream, conn, 200, payload)

    async def stream_completion(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        req: Request,
        model: str,
        *,
        chat: bool,
    ) -> None:
        headers = [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
            ("x-test-backend-pid", str(os.getpid())),
        ]
        await stream.send_all(
            conn.send(h11.Response(status_code=200, headers=headers, reason=b"OK")) or b""
        )
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{os.getpid()}-{self.started}"
        for i in range(self.o.chunks):
            if i:
                await trio.sleep(self.o.chunk_interval)
            piece = f"tok{i} "
            choice: dict[str, object] = (
                {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                if chat
                else {"index": 0, "text": piece, "finish_reason": None}
            )
            await self._event(stream, conn, _chunk(ident, model, choice, chat=chat))
        final: dict[str, object] = (
            {"index": 0, "delta": {}, "finish_reason": "stop"}
            if chat
            else {"index": 0, "text": "", "finish_reason": "stop"}
        )
        self.count(req)
        await self._event(stream, conn, _chunk(ident, model, final, chat=chat))
        await stream.send_all(conn.send(h11.Data(data=b"data: [DONE]\n\n")) or b"")
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")

    async def _event(self, stream: trio.SocketStream, conn: h11.Connection, value: object) -> None:
        data = b"data: " + json.dumps(value).encode() + b"\n\n"
        await stream.send_all(conn.send(h11.Data(data=data)) or b"")

    def count(self, req: Request) -> None:
        self.served += 1
        if self.o.counter_file:
            ident = (
                req.headers.get("x-yard-request-id")
                or req.headers.get("x-request-id")
                or f"req-{self.served}"
            )
            with open(self.o.counter_file, "a") as f:
                f.write(ident + "\n")


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _error(message: str, code: int | str = "error") -> dict[str, object]:
    return {"error": {"message": message, "type": "server_error", "code": code}}


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _image_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        return 64, 64
    return max(1, min(w, 512)), max(1, min(h, 512))


def _prompt_text(body: dict[str, object], *, chat: bool) -> str:
    if chat:
        messages = body.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
            return str(messages[-1].get("content", ""))
        return ""
    return str(body.get("prompt", ""))


def _completion(model: str, body: dict[str, object], *, chat: bool) -> dict[str, object]:
    text = f"echo: {_prompt_text(body, chat=chat)}"
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    if chat:
        return {
            "id": f"chatcmpl-{os.getpid()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }
    return {
        "id": f"cmpl-{os.getpid()}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
        "usage": usage,
    }


def _chunk(ident: str, model: str, choice: dict[str, object], *, chat: bool) -> dict[str, object]:
    return {
        "id": ident,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }


async def serve(options: Options) -> None:
    """Run the backend until killed."""
    await trio.sleep(options.slow_start)
    backend = Backend(options)
    listeners = await trio.open_tcp_listeners(options.port, host=options.host, backlog=128)
    sockname = listeners[0].socket.getsockname()
    print(f"listening on http://{options.host}:{sockname[1]}", flush=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backend.load)
        await trio.serve_listeners(backend.serve_connection, listeners)


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    if options.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if options.child:
        # Same process group, so yard's group signal must reach it too.
        child = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(3600)"]
        )
        print(f"child pid {child.pid}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve, options)


if __name__ == "__main__":
    main()
