from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from quart.typing import TestHTTPConnectionProtocol
from quart_trio import QuartTrio

from yard.observe import Observer, install
from yard.testing.engine import FakeEngine, GiB, device_view, profile

ADMIN_KEY = "sesame-admin"
LOOPBACK = {"client": ("127.0.0.1", 40000)}
REMOTE = {"client": ("192.0.2.7", 40000)}


def make_app(engine: FakeEngine, *, admin_key: str | None = ADMIN_KEY) -> QuartTrio:
    app = QuartTrio(__name__)
    install(
        app,
        Observer(
            engine=engine,
            admin_key=admin_key,
            models={"llm": ("tiny-llm", "tiny-llm-chat"), "tts": ("voice",)},
            profile_margin=1.25,
            started_at=1_000.0,
        ),
    )
    return app


@pytest.fixture
def engine() -> FakeEngine:
    """Two backends on one GPU: llm ready and measured, tts stopped."""
    fake = FakeEngine()
    fake.devices.append(
        device_view(
            "gpu0",
            committed_bytes=5 * GiB,
            live_bytes={"llm": 3 * GiB},
            foreign_bytes=2 * GiB,
            free_bytes=16 * GiB,
        )
    )
    fake.set_backend(
        "llm",
        state="ready",
        gpus=("gpu0",),
        slots=2,
        served=7,
        loaded_at=0.0,
        profile=profile(4, 1, 12.5),
        last_load_s=12.5,
        reason="serving",
    )
    fake.set_backend("tts", reason="never asked for")
    return fake


@pytest.fixture
def app(engine: FakeEngine) -> QuartTrio:
    return make_app(engine)


class Stream:
    """The body of a streaming response, read as it comes."""

    def __init__(self, connection: TestHTTPConnectionProtocol) -> None:
        self._connection = connection
        self.received = b""

    async def read_until(self, marker: bytes) -> bytes:
        """Read until ``marker`` has arrived; return everything so far."""
        while marker not in self.received:
            self.received += await self._connection.receive()
        return self.received


@asynccontextmanager
async def open_stream(
    app: QuartTrio, path: str, *, headers: dict[str, str] | None = None
) -> AsyncIterator[Stream]:
    """GET ``path`` from loopback and read its endless body. Leaving the block
    hangs up (Quart's test client would otherwise wait for the body to end)."""
    with trio.CancelScope() as scope:
        async with app.test_client().request(
            path, headers=headers or {}, scope_base=LOOPBACK
        ) as connection:
            await connection.send_complete()
            yield Stream(connection)
            scope.cancel()
