"""Two nodes through an outage of their database (issue 26): neither is taken
for dead once it is back, the job each ran during the outage ends with its
backend's answer, and every route answers JSON meanwhile, never a 500.

Real ``yard serve`` processes, heartbeats out of phase, the module's own
PostgreSQL stopped (as a crash) for four times ``dead_after_s``. The long
form, with 10, 12 and 20 s outages and the default timings, five runs each,
is ``python -m bench.outage``.

Its own module: it stops and restarts this module's PostgreSQL server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

from yard.testing.cluster import CHAT, Cluster, backend_table, running_cluster, submit
from yard.testing.postgres import PostgresServer

HEARTBEAT_S = 0.5
DEAD_AFTER_S = 1.5
OUTAGE_S = 4 * DEAD_AFTER_S


async def _job(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    return dict((await client.get(f"/v1/jobs/{job_id}")).json())


async def running_on_each(cluster: Cluster, names: tuple[str, str]) -> list[str]:
    """One job running on each node (handed in on the first); the caller
    bounds the wait."""
    client = cluster.clients[names[0]]
    jobs: list[str] = []
    for _ in names:
        jobs.append(await submit(client, 50))
        while True:
            if (await _job(client, jobs[-1]))["status"] == "running":
                break
            await trio.sleep(0.05)
    return jobs


def nodes_table(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {str(n): str(s) for n, s in conn.execute("SELECT name, state FROM nodes")}


def claimers(dsn: str, jobs: list[str]) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT claimed_by FROM jobs WHERE id = ANY(%s)", (jobs,)).fetchall()
    return {str(row[0]) for row in rows}


async def probe(cluster: Cluster, job_id: str, answers: list[tuple[int, str, str | None]]) -> None:
    """Hand a job in and read one on every node, every 0.2 s, keeping
    (status, error code or job status, Retry-After); until cancelled."""
    while True:
        for client in cluster.clients.values():
            for response in (
                await client.post(
                    "/v1/chat/completions", json=CHAT, headers={"prefer": "respond-async"}
                ),
                await client.get(f"/v1/jobs/{job_id}"),
            ):
                try:
                    body = response.json()
                except ValueError:
                    body = {"error": {"code": f"not JSON: {response.text[:60]!r}"}}
                error = body.get("error")
                code = error["code"] if isinstance(error, dict) else body.get("status")
                retry = response.headers.get("retry-after")
                answers.append((response.status_code, str(code), retry))
        await trio.sleep(0.2)


@pytest.mark.slow
async def test_nodes_through_a_database_outage_are_not_reaped_and_keep_their_results(
    postgres_server: PostgresServer, postgres_dsn: str, tmp_path: Path
) -> None:
    llm = backend_table("llm", ["tiny"], service_time=3.0)
    answers: list[tuple[int, str, str | None]] = []
    async with running_cluster(
        postgres_dsn,
        tmp_path,
        {"a": llm, "b": llm},
        heartbeat_s=HEARTBEAT_S,
        dead_after_s=DEAD_AFTER_S,
    ) as cluster:
        with trio.fail_after(90):
            await cluster.load("a", "llm")
            await cluster.load("b", "llm")
            jobs = await running_on_each(cluster, ("a", "b"))
        assert await trio.to_thread.run_sync(claimers, postgres_dsn, jobs) == {"a", "b"}
        await trio.to_thread.run_sync(postgres_server.stop)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe, cluster, jobs[0], answers)
                await trio.sleep(OUTAGE_S)
                nursery.cancel_scope.cancel()
        finally:
            await trio.to_thread.run_sync(postgres_server.start)
        with trio.fail_after(60):
            ended = [await _job(cluster.clients["a"], j) for j in jobs]
            while any(job["status"] in ("queued", "running") for job in ended):
                await trio.sleep(0.2)
                ended = [await _job(cluster.clients["a"], j) for j in jobs]
            # Three times dead_after_s later, still nobody was taken for dead.
            await trio.sleep(3 * DEAD_AFTER_S)
        nodes = await trio.to_thread.run_sync(nodes_table, postgres_dsn)
        results = [await cluster.clients["b"].get(f"/v1/jobs/{j}/result") for j in jobs]
    assert nodes == {"a": "up", "b": "up"}
    assert [job["status"] for job in ended] == ["succeeded", "succeeded"], ended
    assert [r.status_code for r in results] == [200, 200]
    for name in ("a", "b"):
        assert "taken as gone" not in (tmp_path / name / "yard-0.log").read_text()
    # Every answer meanwhile: JSON; a refusal is 503 with a code and Retry-After.
    assert answers
    assert not [a for a in answers if a[0] >= 500 and a[0] != 503], answers
    refused = [a for a in answers if a[0] == 503]
    assert refused and all(a[1] == "database_unavailable" and a[2] for a in refused)
