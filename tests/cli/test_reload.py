"""``yard reload`` and SIGHUP on a running yard (issue 25): an invalid file
keeps the running configuration (requests during and after: 200) and the
error is logged; a valid one that adds a backend serves it without a
restart; a removed one is gone. Real processes, bounded."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from tests.gateway.conftest import free_port, wait_healthy

pytestmark = pytest.mark.slow

BACKEND = (
    'command = ["{python}", "-m", "yard.testing.backend", "--port", "{port}", '
    '"--load-time", "0.1"]\nstartup_timeout_s = 30\n'
)


def _write(path: Path, port: int, *backends: str, extra: str = "") -> None:
    text = f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = "data"\n\n'
    for name in backends:
        text += f'[backends.{name}]\nmodels = ["{name}", "{name}-too"]\n{BACKEND}{extra}\n'
    path.write_text(text)


def _yard(*args: str) -> list[str]:
    return [sys.executable, "-m", "yard.cli", *args]


@asynccontextmanager
async def _serving(tmp_path: Path, config: Path, port: int) -> AsyncIterator[trio.Process]:
    with (tmp_path / "yard.log").open("wb") as log:
        proc = await trio.lowlevel.open_process(
            _yard("serve", "--config", str(config)), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            with trio.fail_after(60):
                await wait_healthy(client)
        yield proc
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.terminate()
                with trio.move_on_after(20):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _chat(client: httpx.AsyncClient, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return (await client.post("/v1/chat/completions", json=body)).status_code


async def _reload(config: Path) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        _yard("reload", "--config", str(config)),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )


async def test_reload_keeps_an_invalid_file_out_and_serves_a_new_backend_without_restart(
    tmp_path: Path,
) -> None:
    port = free_port()
    config = tmp_path / "yard.toml"
    _write(config, port, "a")
    with trio.fail_after(120):
        async with (
            _serving(tmp_path, config, port) as proc,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
        ):
            assert await _chat(client, "a") == 200
            # An invalid file: yard keeps serving what it runs, and says why.
            _write(config, port, "a", "b", extra="slots = 0\n")
            during: list[int] = []

            async def request_during() -> None:
                during.append(await _chat(client, "a"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(request_during)
                refused = await _reload(config)
            assert refused.returncode == 1
            assert b"backends.a.slots: must be at least 1, got 0" in refused.stderr
            assert b"kept its configuration" in refused.stderr
            assert during == [200]
            assert await _chat(client, "a") == 200
            assert await _chat(client, "b") == 404  # not added
            log = (tmp_path / "yard.log").read_text()
            assert "backends.a.slots: must be at least 1, got 0" in log
            # A valid file adding b and removing a: b is served, same process.
            _write(config, port, "b")
            done = await _reload(config)
            assert done.returncode == 0, done.stderr
            assert b"added: b" in done.stdout and b"removed (drain, then stop): a" in done.stdout
            assert await _chat(client, "b") == 200
            assert await _chat(client, "a") == 404
            assert proc.returncode is None
            # yard models (the status document) shows the new file's names.
            listed = await trio.run_process(
                _yard("models", "--url", f"http://127.0.0.1:{port}"),
                capture_stdout=True,
                check=False,
            )
            names = [line.split()[0] for line in listed.stdout.decode().splitlines()[1:]]
            assert sorted(names) == ["b", "b-too"]
            # a comes back: measured on its first load, it keeps its stored profile.
            _write(config, port, "a", "b")
            again = await _reload(config)
            assert b"added: a" in again.stdout, again.stderr
            listed = await trio.run_process(
                _yard("models", "--url", f"http://127.0.0.1:{port}"),
                capture_stdout=True,
                check=False,
            )
            rows = {line.split()[0]: line for line in listed.stdout.decode().splitlines()[1:]}
            assert "stopped" in rows["a"] and "(measured)" in rows["a"], rows
