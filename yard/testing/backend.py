"""The fake backend as a real process: real HTTP, real memory, failures on demand.

``python -m yard.testing.backend --port 0 --load-time 1 --memory 512MiB``

This is :mod:`yard.testing.fake` (``answer="openai"``, nothing recorded)
with its switches on the command line. It speaks enough of the OpenAI API
for yard's proxy, jobs and benchmarks:

- ``GET /health``: 503 ``Loading model`` while loading (as llama-server
  does), then 200.
- ``GET /v1/models``; ``POST /v1/chat/completions`` and ``/v1/completions``
  (JSON, or server-sent events with ``"stream": true``: ``--chunks`` chunks,
  ``--chunk-interval`` apart); ``/v1/embeddings``; ``/v1/images/generations``
  (a real PNG, base64 in JSON); ``/v1/audio/speech`` (a real WAV);
  ``/v1/audio/transcriptions`` (multipart in, text out).
- Any other path: an echo of method, target, path, query, headers and body
  (for ``api = "plain"`` backends); the fake's special paths (``/status/N``,
  ``/cut-after``, ``/hang``, ...) as in :mod:`yard.testing.fake`.

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
- ``--gpu-file PATH --model-file GGUF --context N [--parallel P] [--skew F]``:
  a llama-server on a busy card: while loading, take from the shared fake GPU
  (:mod:`yard.testing.gpu`) what the model's estimate gives at ``N`` tokens,
  times ``F``; where that does not fit, print llama.cpp's out-of-memory lines
  and exit 1 (``--oom-stays-up``: stay up, health answering 503, as a server
  that survives its failed context may). ``GET /props`` answers a slot's
  context (capped at the model's trained one) and the slots.

It prints ``listening on http://HOST:PORT`` on stdout once bound, and
``ready`` once loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
from collections.abc import Sequence

import trio

from yard.config import parse_size
from yard.testing.fake import FakeBackend, Options, Request, touch

__all__ = ["Backend", "Options", "Request", "backend_command", "main", "parse_args", "touch"]

#: The process's server: the fake (a subclass may wrap :meth:`~FakeBackend.api`).
Backend = FakeBackend


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
    p.add_argument("--gpu-file", default=None)
    p.add_argument("--model-file", default=None)
    p.add_argument("--context", type=int, default=None)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--skew", type=float, default=1.0)
    p.add_argument("--oom-stays-up", action="store_true")
    ns = p.parse_args(list(argv))
    values = {k: v for k, v in vars(ns).items() if v is not None}
    return Options(answer="openai", record=False, **values)


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
