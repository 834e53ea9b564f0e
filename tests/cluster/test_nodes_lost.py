"""A node that loses the shared database (issue 13): it claims nothing new,
keeps serving what it has, says so in ``/healthz``, the status document and
its log, and writes the results it kept once the database is back.

Its own module: it stops and restarts this module's PostgreSQL server.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from yard.testing.cluster import (
    CHAT,
    Cluster,
    backend_table,
    free_port,
    running_cluster,
    submit,
)
from yard.testing.postgres import PostgresServer


async def _status(client: httpx.AsyncClient, job_id: str) -> str:
    response = await client.get(f"/v1/jobs/{job_id}")
    return str(response.json()["status"]) if response.status_code == 200 else "unreadable"


async def _database(cluster: Cluster) -> str:
    return str((await cluster.wait_healthy("a"))["database"])


async def _until(read: Callable[[], Awaitable[str]], wanted: str) -> None:
    """Until ``read()`` gives ``wanted``; the caller bounds the wait."""
    while True:
        if await read() == wanted:
            return
        await trio.sleep(0.1)


async def _until_ended(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    """The job's JSON once it has ended; the caller bounds the wait."""
    while True:
        response = await client.get(f"/v1/jobs/{job_id}")
        if response.status_code == 200 and response.json()["status"] not in ("queued", "running"):
            return dict(response.json())
        await trio.sleep(0.1)


@pytest.mark.slow
async def test_a_node_without_its_database_serves_what_it_has_and_catches_up(
    postgres_server: PostgresServer, postgres_dsn: str, tmp_path: Path
) -> None:
    llm = backend_table("llm", ["tiny"], service_time=2.0)
    async with running_cluster(postgres_dsn, tmp_path, {"a": llm}) as cluster:
        a = cluster.clients["a"]
        with trio.fail_after(60):
            await cluster.load("a", "llm")  # (no other node: returns at once)
            job = await submit(a, 50)
            await _until(lambda: _status(a, job), "running")
        await trio.to_thread.run_sync(postgres_server.stop)
        try:
            with trio.fail_after(60):
                await _until(lambda: _database(cluster), "lost")
                assert (await cluster.wait_healthy("a"))["status"] == "degraded"
                status = (await a.get("/admin/status")).json()
                assert status["cluster"]["database"] == "lost"
                # Still serving what it can without the database.
                response = await a.post("/v1/chat/completions", json=CHAT)
                assert response.status_code == 200, response.text
                # The job ends meanwhile (2 s); its result waits in memory.
                await trio.sleep(2.5)
        finally:
            await trio.to_thread.run_sync(postgres_server.start)
        with trio.fail_after(60):
            await _until(lambda: _database(cluster), "ok")
            # The result it kept is written: the job ends as it did (not
            # failed by the loss: the error would say why).
            ended = await _until_ended(a, job)
        assert ended["status"] == "succeeded", ended
        result = await a.get(f"/v1/jobs/{job}/result")
        assert result.status_code == 200
    log = (tmp_path / "a" / "yard-0.log").read_text()
    assert "lost the shared database" in log
    assert "the shared database is back" in log
    assert f"job {job}: cannot record its end" in log


@pytest.mark.slow
async def test_a_node_that_cannot_reach_its_database_at_start_says_so_and_exits_1(
    tmp_path: Path,
) -> None:
    config = tmp_path / "yard.toml"
    config.write_text(
        f'[server]\nlisten = "127.0.0.1:{free_port()}"\ndata_dir = "{tmp_path / "data"}"\n'
        '[cluster]\ndatabase = "postgresql://postgres@127.0.0.1:1/yard"\nnode = "x"\n'
    )
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "yard.cli", "serve", "--config", str(config)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 1
    last = done.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("yard: the cluster's database ([cluster] database): cannot reach")
