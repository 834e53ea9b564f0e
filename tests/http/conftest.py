"""Harness for the proxy tests: the real gateway app on yard's own HTTP server,
the fake engine, and an in-process fake backend.

Two ways to reach it: ``gw`` listens on a free loopback port for httpx (the
wall clock); ``vgw`` hands each client connection, a loopback TCP pair,
straight to the server under MockClock, so that a test of timing sees exact
virtual times (the server watches its sockets, so the pair is TCP, not a
memory stream).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx
import pytest
import trio
import trio.testing

from tests.http.virtual import VirtualGateway
from yard.app.web import Parts, create_app, create_control_app, serve_app
from yard.config import AppConfig, BackendConfig, Config, ServerConfig
from yard.core.spec import SchedulerConfig
from yard.engine import Engine
from yard.h1.asgi import ASGIApp
from yard.h1.server import Server
from yard.http.gateway import Gateway as GatewayApp
from yard.http.ports import JobService, RequestHook
from yard.testing.engine import FakeEngine
from yard.testing.fake import FakeBackend as Upstream
from yard.testing.fake import serve_fake as serve_upstream


def make_config(
    *, apps: dict[str, AppConfig] | None = None, max_body_bytes: int = 1 << 20
) -> Config:
    backends = {
        "llm": BackendConfig(name="llm", models=("tiny", "tiny-alias"), command=("true",)),
        "whisper": BackendConfig(name="whisper", models=("whisper-1",), command=("true",)),
        "music": BackendConfig(name="music", models=(), command=("true",), api="plain"),
    }
    return Config(
        path=Path("/nonexistent/yard.toml"),
        server=ServerConfig(max_body_bytes=max_body_bytes, default_priority=50.0),
        scheduler=SchedulerConfig(),
        devices={},
        apps=apps or {},
        backends=backends,
    )


APPS = {
    "chat": AppConfig(name="chat", key="key-chat", default_priority=60.0, max_priority=80.0),
    "batch": AppConfig(name="batch", key="key-batch", default_priority=10.0, max_priority=20.0),
}


@dataclass
class Gateway:
    url: str
    client: httpx.AsyncClient
    engine: FakeEngine
    upstream: Upstream
    parts: Parts


class GatewayFactory:
    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.parts: list[Parts] = []

    async def __call__(
        self,
        *,
        config: Config | None = None,
        jobs: JobService | None = None,
        observe: RequestHook | None = None,
    ) -> Gateway:
        """A gateway on a free port; ``observe`` replaces the metrics hook
        (``yard.observe.observe_request``), to record what it hears."""
        upstream = await self.nursery.start(serve_upstream, Upstream())
        engine = FakeEngine(
            dict.fromkeys(("llm", "whisper", "music"), upstream.base_url),
            auto_dispatch=True,
            lost="fail",
            queue_time_s=0.0125,
        )
        parts = Parts(
            config=config or make_config(),
            engine=cast(Engine, engine),
            jobs=jobs,
            started_at=1_700_000_000.0,
        )
        self.parts.append(parts)
        app: ASGIApp = create_app(parts) if observe is None else observed_gateway(parts, observe)
        binds = await self.nursery.start(serve_app, app, "127.0.0.1", 0)
        client = httpx.AsyncClient(base_url=binds[0], timeout=10.0)
        return Gateway(binds[0], client, engine, upstream, parts)


@pytest.fixture
async def gateway_factory() -> AsyncIterator[GatewayFactory]:
    async with trio.open_nursery() as nursery:
        factory = GatewayFactory(nursery)
        yield factory
        nursery.cancel_scope.cancel()
    for parts in factory.parts:
        parts.pool.close_idle()


@pytest.fixture
async def gw(gateway_factory: GatewayFactory) -> AsyncIterator[Gateway]:
    gateway = await gateway_factory()
    async with gateway.client:
        yield gateway


@pytest.fixture
async def vgw(
    autojump_clock: trio.testing.MockClock,
) -> AsyncIterator[VirtualGateway[FakeEngine]]:
    """The gateway under MockClock (the test runs on virtual time)."""
    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(serve_upstream, Upstream())
        engine = FakeEngine(
            dict.fromkeys(("llm", "whisper", "music"), upstream.base_url),
            auto_dispatch=True,
            lost="fail",
            queue_time_s=0.0125,
        )
        parts = Parts(
            config=make_config(),
            engine=cast(Engine, engine),
            jobs=None,
            started_at=1_700_000_000.0,
        )
        server = Server(create_app(parts))
        server.nursery = nursery
        gateway = VirtualGateway(server, nursery, engine, upstream, parts)
        yield gateway
        nursery.cancel_scope.cancel()
        for client in gateway.clients:
            client.socket.close()
    parts.pool.close_idle()


def observed_gateway(parts: Parts, hook: RequestHook) -> GatewayApp:
    """The data plane of ``parts`` in front of its control plane, with
    ``hook`` as the metrics hook."""
    return GatewayApp(
        cast(ASGIApp, create_control_app(parts)),
        config=parts.config,
        engine=parts.engine,
        pool=parts.pool,
        started_at=parts.started_at,
        jobs=parts.jobs,
        observe=hook,
    )


def observed(vgw: VirtualGateway[FakeEngine], hook: RequestHook) -> None:
    """Serve ``vgw`` with ``hook`` as the metrics hook (as ``gateway_factory``'s
    ``observe`` does)."""
    vgw.server.app = observed_gateway(vgw.parts, hook)
