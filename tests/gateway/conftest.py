"""Harness for the real-path tests: ``yard.serve.serve`` in this process on a
free loopback port, with real test-backend processes (``yard.testing.backend``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from yard.config import load_config
from yard.http.runtime import Runtime
from yard.serve import serve
from yard.testing.backend import backend_command


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
async def running_yard(tmp_path: Path, body: str) -> AsyncIterator[Runtime]:
    """Run yard with the configuration ``body`` until the block ends; every
    backend it started is stopped on the way out."""
    config = load_config(write_config(tmp_path, body))
    async with trio.open_nursery() as nursery:
        runtime: Runtime = await nursery.start(serve, config)
        yield runtime
        nursery.cancel_scope.cancel()


async def wait_until(condition: Callable[[], bool], *, poll_s: float = 0.02) -> None:
    """Poll ``condition`` until it holds (callers bound it with fail_after)."""
    while True:
        if condition():
            return
        await trio.sleep(poll_s)
