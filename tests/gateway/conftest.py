"""Harness for the gateway tests. The real-path tests run ``yard.app.serve.serve``
in this process on a free loopback port, with real test-backend processes
(``yard.testing.backend``); :func:`virtual_yard` runs the gateway and the real
engine on virtual time, with scripted processes and the in-process fake."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio

from tests.http.conftest import APPS, make_config
from tests.http.virtual import ServedLauncher, VirtualGateway
from yard.app.serve import Running, serve
from yard.app.web import Parts, create_app
from yard.config import AppConfig, load_config
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.engine import Engine
from yard.h1.server import Server
from yard.testing.backend import backend_command
from yard.testing.fake import FakeBackend, Options, serve_fake
from yard.testing.ports import Script


def backend_toml(
    name: str,
    *,
    models: tuple[str, ...] = (),
    slots: int = 1,
    api: str = "openai",
    switches: Mapping[str, object] | None = None,
) -> str:
    """A ``[backends.NAME]`` table running the test backend with ``switches``."""
    argv = backend_command(**(switches or {}))
    lines = [
        f"[backends.{name}]",
        f"command = {json.dumps(argv)}",
        f"models = {json.dumps(list(models))}",
        f"slots = {slots}",
        f'api = "{api}"',
        "startup_timeout_s = 30",
    ]
    return "\n".join(lines) + "\n"


def write_config(tmp_path: Path, body: str, *, listen: str = "127.0.0.1:0") -> Path:
    path = tmp_path / "yard.toml"
    path.write_text(
        f'[server]\nlisten = "{listen}"\ndata_dir = "{tmp_path / "data"}"\nstop_grace_s = 2\n\n'
        + body
    )
    return path


@asynccontextmanager
async def running_yard(tmp_path: Path, body: str) -> AsyncIterator[Running]:
    """Run yard with the configuration ``body`` until the block ends; every
    backend it started is stopped on the way out."""
    config = load_config(write_config(tmp_path, body))
    async with trio.open_nursery() as nursery:
        running: Running = await nursery.start(serve, config)
        yield running
        nursery.cancel_scope.cancel()


def free_port() -> int:
    """A loopback port that was free a moment ago (for a yard in a process)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_healthy(client: httpx.AsyncClient) -> None:
    """Poll ``/healthz`` until yard serves (callers bound it with fail_after)."""
    while True:
        try:
            if (await client.get("/healthz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await trio.sleep(0.05)


async def wait_until(condition: Callable[[], bool], *, poll_s: float = 0.02) -> None:
    """Poll ``condition`` until it holds (callers bound it with fail_after)."""
    while True:
        if condition():
            return
        await trio.sleep(poll_s)


@asynccontextmanager
async def virtual_yard(
    fake: Options, *, load_s: float = 2.0, apps: Mapping[str, AppConfig] = APPS
) -> AsyncIterator[VirtualGateway[Engine]]:
    """The gateway with the real engine and scheduler core, for tests under
    MockClock: one backend, ``llm`` (model ``tiny``, one slot, on the host),
    whose process loads in ``load_s`` and answers as the fake backend with
    options ``fake``; clients connect through loopback TCP pairs."""
    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(serve_fake, FakeBackend(fake))
        scheduler = Scheduler(
            [DeviceSpec(name="host", kind="host", total_bytes=64 * 2**30)],
            [BackendSpec(name="llm", slots=1)],
            SchedulerConfig(),
        )
        launcher = ServedLauncher(upstream.base_url, {"llm": Script(ready_after_s=load_s)})
        engine = Engine(scheduler=scheduler, launcher=launcher)
        await nursery.start(engine.run)
        parts = Parts(
            config=make_config(apps=dict(apps)), engine=engine, started_at=1_700_000_000.0
        )
        server = Server(create_app(parts))
        server.nursery = nursery
        gateway = VirtualGateway(server, nursery, engine, upstream, parts)
        try:
            yield gateway
        finally:
            nursery.cancel_scope.cancel()
            for client in gateway.clients:
                client.socket.close()
            parts.pool.close_idle()
