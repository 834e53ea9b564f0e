"""Run the test backend as a real process from a test or a benchmark.

``async with running_backend(load_time=0.2, memory="64MiB") as backend:``
starts ``python -m yard.testing.backend`` on a free loopback port in its own
process group, waits for it to be healthy (unless ``wait_ready=False``), and
on exit kills the whole group and reaps it, whatever happened inside.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import httpx
import trio

from yard.testing.backend import backend_command


@dataclass(slots=True, kw_only=True)
class RunningBackend:
    """A test backend process started by :func:`running_backend`."""

    process: trio.Process
    port: int
    stdout_lines: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    async def wait_ready(self) -> None:
        """Poll /health until it answers 200 (the caller bounds the wait)."""
        async with httpx.AsyncClient(base_url=self.base_url) as client:
            while True:
                try:
                    response = await client.get("/health")
                except httpx.TransportError:
                    response = None
                if response is not None and response.status_code == 200:
                    return
                if self.process.returncode is not None:
                    raise RuntimeError(f"test backend exited with {self.process.returncode}")
                await trio.sleep(0.02)


async def _read_until_listening(stream: trio.abc.ReceiveStream, into: list[str]) -> int:
    """Collect stdout lines up to ``listening on http://HOST:PORT``; return PORT.
    (Later lines are few and small; they stay in the pipe.)"""
    buffer = b""
    while True:
        chunk = await stream.receive_some(4096)
        if not chunk:
            raise RuntimeError(f"test backend closed stdout before listening: {into}")
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            into.append(text)
            if text.startswith("listening on "):
                return int(text.rsplit(":", 1)[1])


@asynccontextmanager
async def running_backend(
    *, wait_ready: bool = True, **switches: object
) -> AsyncIterator[RunningBackend]:
    """Start the test backend with ``switches`` (see
    :func:`yard.testing.backend.backend_command`) and yield it once it
    listens (and is healthy, if ``wait_ready``). Its process group is killed
    on exit. The caller bounds the whole thing with ``trio.fail_after``."""
    argv = backend_command(**{**switches, "port": 0})
    process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert process.stdout is not None
        lines: list[str] = []
        port = await _read_until_listening(process.stdout, lines)
        backend = RunningBackend(process=process, port=port, stdout_lines=lines)
        if wait_ready:
            await backend.wait_ready()
        yield backend
    finally:
        with trio.CancelScope(shield=True):
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
