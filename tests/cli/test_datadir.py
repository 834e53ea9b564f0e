"""One yard per data directory (issue 24, item 4): the lock of
:mod:`yard.datadir`, in this process and with real ``yard`` processes."""

from __future__ import annotations

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

from tests.gateway.conftest import free_port, wait_healthy
from yard import datadir


def test_a_held_data_dir_refuses_a_second_holder_and_names_the_first(tmp_path: Path) -> None:
    with datadir.hold(tmp_path, command="yard serve", listen="127.0.0.1:8080"):
        assert (
            datadir.holder(tmp_path)
            == f"yard serve (pid {os.getpid()}, listening on 127.0.0.1:8080)"
        )
        with pytest.raises(datadir.DataDirInUse) as refused, datadir.hold(tmp_path, command="x"):
            pass
    assert f"yard serve (pid {os.getpid()}, listening on 127.0.0.1:8080)" in str(refused.value)
    assert "another data directory" in str(refused.value)


def test_a_released_data_dir_can_be_held_again(tmp_path: Path) -> None:
    with datadir.hold(tmp_path / "new", command="yard probe"):
        pass
    assert datadir.holder(tmp_path / "new") is None
    with datadir.hold(tmp_path / "new", command="yard serve"):
        assert datadir.holder(tmp_path / "new") == f"yard serve (pid {os.getpid()})"


def test_nobody_holds_a_data_dir_that_was_never_used(tmp_path: Path) -> None:
    assert datadir.holder(tmp_path / "nothing") is None


def _config(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "yard.toml"
    path.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = "data"\n\n'
        # As in the demo: apps with keys, no admin key.
        '[apps.notebook]\nkey = "sk-notebook"\n\n'
        '[backends.tb]\nmodels = ["tb"]\n'
        'command = ["{python}", "-m", "yard.testing.backend", "--port", "{port}"]\n'
    )
    return path


def _yard(*args: str) -> list[str]:
    return [sys.executable, "-m", "yard.cli", *args]


@asynccontextmanager
async def _serving(tmp_path: Path, config: Path, port: int) -> AsyncIterator[trio.Process]:
    with (tmp_path / f"yard-{port}.log").open("wb") as log:
        proc = await trio.lowlevel.open_process(
            _yard("serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            with trio.fail_after(60):
                await wait_healthy(client)
        yield proc
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


@pytest.mark.slow
async def test_a_second_yard_on_a_data_dir_in_use_exits_at_once_and_a_killed_one_blocks_nothing(
    tmp_path: Path,
) -> None:
    first_port, second_port = free_port(), free_port()
    config = _config(tmp_path, first_port)
    async with _serving(tmp_path, config, first_port) as first:
        # Another port, the same data directory: refused before it starts anything.
        with trio.fail_after(30):
            second = await trio.run_process(
                _yard("serve", "--config", str(config), "--listen", f"127.0.0.1:{second_port}"),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert second.returncode == 1
        said = second.stderr.decode()
        assert (
            f"in use by yard serve (pid {first.pid}, listening on 127.0.0.1:{first_port})" in said
        )
        # yard probe follows the same rule.
        with trio.fail_after(30):
            probe = await trio.run_process(
                _yard("probe", "tb", "--config", str(config)),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert probe.returncode == 3
        assert f"pid {first.pid}" in probe.stderr.decode()
        # yard jobs reaches it through its API: from this machine, with no admin
        # key configured, no key is needed (the admin API's rule; it was 401).
        with trio.fail_after(30):
            jobs = await trio.run_process(
                _yard("jobs", "list", "--config", str(config)),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert jobs.returncode == 0, jobs.stderr.decode()
        os.kill(first.pid, signal.SIGKILL)
        with trio.fail_after(10):
            await first.wait()
    # The kernel dropped the lock with the process: the next start works.
    async with _serving(tmp_path, config, second_port) as third:
        assert datadir.holder(tmp_path / "data") == (
            f"yard serve (pid {third.pid}, listening on 127.0.0.1:{second_port})"
        )
    # And with nobody serving, yard jobs says so instead of a bare connection error.
    with trio.fail_after(30):
        jobs = await trio.run_process(
            _yard("jobs", "list", "--config", str(config)),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert jobs.returncode == 2
    assert "no yard is running on" in jobs.stderr.decode()
