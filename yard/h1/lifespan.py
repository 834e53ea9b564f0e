"""The ASGI ``lifespan`` protocol for yard's HTTP/1.1 server."""

from __future__ import annotations

from typing import Any

import trio

from yard.h1.asgi import ASGIApp, Message


async def run_lifespan(
    app: ASGIApp,
    state: dict[str, Any],
    started: trio.Event,
    stop: trio.Event,
    stopped: trio.Event,
    failure: list[str],
) -> None:
    """Run the app's lifespan: startup at once, shutdown once ``stop`` is set.

    ``started`` is set when the app reports its startup (a failed one's
    message is appended to ``failure``), ``stopped`` when it reports its
    shutdown; both also when the app returns or raises, so nobody waits on
    an app that does not speak the protocol.
    """
    to_app_send, to_app_receive = trio.open_memory_channel[Message](2)
    await to_app_send.send({"type": "lifespan.startup"})

    async def receive() -> Message:
        return await to_app_receive.receive()

    async def send(message: Message) -> None:
        kind = message["type"]
        if kind in ("lifespan.startup.complete", "lifespan.startup.failed"):
            if kind == "lifespan.startup.failed":
                failure.append(str(message.get("message", "")))
            started.set()
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            stopped.set()

    async def shutdown_when_asked() -> None:
        await stop.wait()
        await to_app_send.send({"type": "lifespan.shutdown"})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(shutdown_when_asked)
        try:
            await app(
                {"type": "lifespan", "asgi": {"version": "3.0"}, "state": state}, receive, send
            )
        finally:
            started.set()
            stopped.set()
            nursery.cancel_scope.cancel()
