"""``yard serve`` as a real process, stopped by signals: whatever arrives and
whenever, yard exits only once every backend process group is gone.
Slow: each test starts yard and test backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from tests.gateway.conftest import free_port, wait_healthy, wait_until
from yard.app.serve import stop_signals
from yard.config import load_config
from yard.core.spec import Profile
from yard.memory import default_meter
from yard.memory.profiles import open_profile_store
from yard.supervisor import group_members
from yard.testing.backend import backend_command

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, port: int, *, stop_grace_s: float, **switches: object) -> Path:
    """Two test backends (each with a child in its group) that ignore SIGTERM,
    so that only SIGKILL after ``stop_grace_s`` (or a hurried stop) ends them."""
    argv = backend_command(ignore_sigterm=True, child=True, **switches)
    text = (
        f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = "{tmp_path / "data"}"\n'
        "stop_grace_s = 1\n\n"
    )
    for name in ("a", "b"):
        text += (
            f"[backends.{name}]\ncommand = {json.dumps(argv)}\nmodels = [{json.dumps(name)}]\n"
            f"startup_timeout_s = 30\nstop_grace_s = {stop_grace_s}\n\n"
        )
    path = tmp_path / "yard.toml"
    path.write_text(text)
    return path


async def _profiled(config: Path) -> Path:
    """Store small profiles for both backends, so that they load side by
    side (a first load is measured alone, which would stop the other)."""
    loaded = load_config(config)
    meter = default_meter()
    try:
        store = await open_profile_store(loaded, devices=meter.describe())
        for name in ("a", "b"):
            await store.put(name, Profile(gpu_bytes=0, host_bytes=64 * 2**20, load_s=0.5))
        await store.aclose()
    finally:
        meter.close()
    return config


@asynccontextmanager
async def _yard(tmp_path: Path, config: Path) -> AsyncIterator[trio.Process]:
    """``yard serve`` in a process of its own; killed (and its backends with
    it) if a test leaves it running."""
    argv = [sys.executable, "-m", "yard.cli", "serve", "--config", str(config)]
    with (tmp_path / "yard.log").open("wb") as log:
        proc = await trio.lowlevel.open_process(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        with trio.CancelScope(shield=True):
            groups = _backend_groups(tmp_path)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            for pgid in groups:
                for pid in group_members(pgid):
                    os.kill(pid, signal.SIGKILL)


def _backend_groups(tmp_path: Path) -> list[int]:
    """The process groups of the backends yard runs now (its pid files)."""
    groups = []
    for path in (tmp_path / "data" / "run").glob("*.pid"):
        try:
            groups.append(int(json.loads(path.read_text())["pgid"]))
        except (OSError, ValueError, KeyError):
            continue
    return groups


async def _load_both(client: httpx.AsyncClient) -> None:
    for model in ("a", "b"):
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text


@asynccontextmanager
async def _loaded_yard(
    tmp_path: Path, *, stop_grace_s: float
) -> AsyncIterator[tuple[trio.Process, list[int], Path]]:
    """``yard serve`` in a process (see :func:`_yard`) with both backends
    loaded: the process, its backends' process groups, and its config."""
    port = free_port()
    config = await _profiled(_config(tmp_path, port, stop_grace_s=stop_grace_s))
    async with _yard(tmp_path, config) as proc:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            await wait_healthy(client)
            await _load_both(client)
        yield proc, _backend_groups(tmp_path), config


async def _wait_logged(tmp_path: Path, text: str) -> None:
    await wait_until(lambda: text in (tmp_path / "yard.log").read_text())


def _survivors(groups: list[int]) -> list[int]:
    return [pid for pgid in groups for pid in group_members(pgid)]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_second_signal_hurries_the_stop_but_leaves_no_backend_behind(
    tmp_path: Path, signum: signal.Signals
) -> None:
    # A grace longer than the test's bound: only a hurried stop ends in time.
    with trio.fail_after(45):
        async with _loaded_yard(tmp_path, stop_grace_s=60) as (proc, groups, _):
            assert len(groups) == 2
            assert _survivors(groups)
            proc.send_signal(signum)
            await _wait_logged(tmp_path, "shutting down gracefully")
            proc.send_signal(signum)
            await proc.wait()
            assert proc.returncode == 0
            assert _survivors(groups) == []
    log = (tmp_path / "yard.log").read_text()
    assert f"{signum.name}: shutting down gracefully" in log
    assert f"{signum.name} again: stopping now" in log


async def test_signals_while_a_backend_loads_leave_no_backend_behind(tmp_path: Path) -> None:
    port = free_port()
    config = await _profiled(_config(tmp_path, port, stop_grace_s=60, load_time=30))
    with trio.fail_after(45):
        async with _yard(tmp_path, config) as proc:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                await wait_healthy(client)
                async with trio.open_nursery() as nursery:

                    async def ask() -> None:
                        body = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}
                        try:
                            response = await client.post("/v1/chat/completions", json=body)
                        except httpx.RemoteProtocolError:
                            return  # cut by the second signal
                        assert response.status_code == 503

                    nursery.start_soon(ask)
                    await wait_until(lambda: bool(_survivors(_backend_groups(tmp_path))))
                    groups = _backend_groups(tmp_path)
                    proc.send_signal(signal.SIGTERM)
                    # Two signals that arrive together are one to trio: the
                    # second is sent once the first was taken.
                    await _wait_logged(tmp_path, "shutting down gracefully")
                    proc.send_signal(signal.SIGTERM)
                    await proc.wait()
            assert proc.returncode == 0
            assert _survivors(groups) == []


async def test_a_signal_during_start_up_stops_yard_with_nothing_left(tmp_path: Path) -> None:
    with trio.fail_after(45):
        async with _loaded_yard(tmp_path, stop_grace_s=60) as (proc, groups, config):
            # Killed outright: its backends are orphans, reaped by the next
            # yard (one that writes to its closed pipe may die of SIGPIPE
            # first: gone either way).
            proc.kill()
            await proc.wait()
        async with _yard(tmp_path, config) as second:
            # Its first log line (the meter's) comes once it catches signals,
            # usually well before it serves: one signal then cancels the
            # start-up (test_serve_shutdown pins that without timing), and
            # the orphans are still reaped.
            log = tmp_path / "yard.log"
            await wait_until(lambda: " yard." in log.read_text())
            second.send_signal(signal.SIGTERM)
            await second.wait()
            assert second.returncode == 0
        assert _survivors(groups) == []


async def test_sighup_reloads_the_configuration_and_yard_keeps_serving(tmp_path: Path) -> None:
    with trio.fail_after(45):
        async with _loaded_yard(tmp_path, stop_grace_s=0.5) as (proc, groups, _):
            proc.send_signal(signal.SIGHUP)
            log = tmp_path / "yard.log"
            await wait_until(lambda: "reload (SIGHUP): no backend changed" in log.read_text())
            assert proc.returncode is None
            assert all(group_members(g) for g in groups)  # its backends run on
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
            assert proc.returncode == 0
            assert _survivors(groups) == []


def test_only_sigint_and_sigterm_stop_yard() -> None:
    assert stop_signals() == (signal.SIGINT, signal.SIGTERM)
