"""The supervisor as the engine's launcher: the contract of yard.ports, end to end
with real processes (no meter: the host is exclusive, so one backend at a time)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from tests.supervisor.test_context_fill import llama_toml
from yard.config import load_config
from yard.core import Scheduler
from yard.core.decisions import StartBackend, StopBackend
from yard.engine import Engine
from yard.supervisor import Supervisor
from yard.testing.backend import backend_command


def backend_toml(name: str, **switches: object) -> str:
    command = backend_command(port="{port}", python="{python}", **switches)
    return f'[backends.{name}]\nmodels = ["{name}"]\ncommand = {json.dumps(command)}\n'


@asynccontextmanager
async def yard(tmp_path: Path, backends: str) -> AsyncIterator[tuple[Engine, Supervisor]]:
    path = tmp_path / "yard.toml"
    path.write_text(f"[server]\ndata_dir = 'data'\n[devices.host]\nexclusive = true\n{backends}")
    config = load_config(path, env={})
    supervisor = Supervisor(config)
    engine = Engine(
        scheduler=Scheduler(
            config.device_specs({"host": 64 * 2**30}), config.backend_specs(), config.scheduler
        ),
        launcher=supervisor,
        start_timeout_s=lambda name: config.backends[name].startup_timeout(None),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await nursery.start(engine.run)
        yield engine, supervisor
        nursery.cancel_scope.cancel()


async def ask(engine: Engine, client: httpx.AsyncClient, backend: str) -> tuple[str, int]:
    """One request through the engine; returns (text, pid that answered)."""
    admission = engine.submit(backend=backend, priority=10)
    assignment = await admission.wait_dispatched()
    try:
        response = await client.post(
            f"{assignment.base_url}/v1/completions", json={"prompt": backend}
        )
    except httpx.TransportError:
        admission.report("upstream_lost")
        raise
    admission.report("ok")
    return response.json()["choices"][0]["text"], int(response.headers["x-test-backend-pid"])


@pytest.mark.slow
async def test_engine_swaps_real_backends_on_an_exclusive_host(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with (
            yard(tmp_path, backend_toml("a", load_time=0.2) + backend_toml("b")) as (engine, sup),
            httpx.AsyncClient(trust_env=False) as client,
        ):
            text_a, pid_a = await ask(engine, client, "a")
            assert text_a == "echo: a"
            assert sorted(sup.running()) == ["a"]
            text_b, pid_b = await ask(engine, client, "b")
            assert text_b == "echo: b"
            # a was stopped (and gone) before b started: one at a time.
            assert sorted(sup.running()) == ["b"]
            assert sup.statistics().launches == 2
            order = [
                (type(d.decision).__name__, getattr(d.decision, "backend", ""))
                for d in engine.decisions()
                if isinstance(d.decision, StartBackend | StopBackend)
            ]
            assert order == [("StartBackend", "a"), ("StopBackend", "a"), ("StartBackend", "b")]
            assert pid_a != pid_b


@pytest.mark.slow
async def test_a_crashed_backend_is_started_again_by_the_core_not_the_supervisor(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with (
            yard(tmp_path, backend_toml("a", crash_after=1)) as (engine, supervisor),
            httpx.AsyncClient(trust_env=False) as client,
        ):
            _, first_pid = await ask(engine, client, "a")
            process = supervisor.running()["a"]
            with pytest.raises(httpx.TransportError):
                await ask(engine, client, "a")
            status = await process.wait_exit()
            assert status.code == 3
            assert "crashing on purpose" in status.detail
            # Nothing restarts it until a request needs it.
            await trio.sleep(0.3)
            assert supervisor.statistics().launches == 1
            _, second_pid = await ask(engine, client, "a")
            assert second_pid != first_pid
            assert supervisor.statistics().launches == 2
            starts = [d for d in engine.decisions() if isinstance(d.decision, StartBackend)]
            assert len(starts) == 2


@pytest.mark.slow
async def test_the_engine_has_a_first_load_of_llama_server_filled_before_it_is_used(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with yard(tmp_path, llama_toml(tmp_path, "llm")) as (engine, sup):
            admission = engine.submit(backend="llm", priority=10)
            await admission.wait_dispatched()
            # No profile yet: the core measures this load, and the supervisor
            # filled the context before the backend counted as ready.
            starts = [
                d.decision for d in engine.decisions() if isinstance(d.decision, StartBackend)
            ]
            assert [s.measure for s in starts] == [True]
            assert "[yard] context filled" in sup.log_lines("llm")
            admission.report("ok")
