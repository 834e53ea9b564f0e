"""Real server processes for tests: started on a free loopback port in their
own process group, awaited until healthy, and always killed and reaped.

Every wait here is unbounded on purpose: the caller bounds it with
``trio.fail_after`` (callers own timeouts).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from yard.demo import xllama_server
from yard.demo.llama_server import find_llama_server
from yard.demo.tts import voice_path


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def llama_server_or_skip() -> list[str]:
    """The command that runs llama.cpp's server: the llama-server binary, or
    else the xllamacpp fallback (the same C++ server, prebuilt); skip the test
    saying how to get one if there is neither."""
    binary = find_llama_server()
    if binary is not None:
        return [str(binary)]
    if xllama_server.available():
        return [sys.executable, "-m", "yard.demo.xllama_server"]
    pytest.skip("no llama-server and no xllamacpp: `make demo-setup` installs them")


def piper_or_skip() -> None:
    """Skip the test unless piper and its voice are installed."""
    if voice_path() is None:
        pytest.skip("piper voice not installed: `make demo-setup` installs it")


@dataclass(slots=True, kw_only=True)
class Server:
    """A server process started by :func:`running_server`."""

    process: trio.Process
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        """What the process wrote to stdout and stderr so far."""
        return self.log.read_text(errors="replace")


async def wait_healthy(server: Server, path: str) -> None:
    """Poll ``GET path`` until it answers 200; raise if the process exits first."""
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        while True:
            if server.process.returncode is not None:
                raise RuntimeError(
                    f"server exited with {server.process.returncode} before it was healthy:\n"
                    + server.log_text()[-4000:]
                )
            with suppress(httpx.TransportError):
                response = await client.get(path)
                if response.status_code == 200:
                    return
            await trio.sleep(0.1)


@asynccontextmanager
async def running_server(
    argv: Sequence[str],
    *,
    port: int,
    log: Path,
    health_path: str = "/health",
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> AsyncIterator[Server]:
    """Start ``argv`` (which must listen on ``port``), yield it once
    ``health_path`` answers 200, and kill its whole process group on exit.
    stdout and stderr go to ``log`` (shown when it dies early)."""
    with log.open("wb") as log_file:
        process = await trio.lowlevel.open_process(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
    server = Server(process=process, port=port, log=log)
    try:
        await wait_healthy(server, health_path)
        yield server
    finally:
        with trio.CancelScope(shield=True):
            # SIGTERM first: yard must stop its own backends on the way out.
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with trio.move_on_after(15):
                await process.wait()
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


def llama_server_argv(command: list[str], model: Path, port: int, *, alias: str) -> list[str]:
    """llama-server (``command``) on ``port`` with ``model``; ``-c`` and
    ``-np`` are given because their defaults come from the model file."""
    return [
        *command,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(model),
        "--alias",
        alias,
        "-c",
        "1024",
        "-np",
        "2",
        "--threads",
        "2",
    ]


def yard_argv(config: Path, port: int) -> list[str]:
    """``yard serve`` with ``config`` on ``port``."""
    return [
        sys.executable,
        "-m",
        "yard.cli",
        "serve",
        "--config",
        str(config),
        "--listen",
        f"127.0.0.1:{port}",
    ]
