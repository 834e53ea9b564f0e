"""Three real ``yard serve`` nodes on loopback, one real PostgreSQL, real test
backends: one priority order across nodes, and a synchronous request sent to a
node without the model answered through the node that has it.

The harness is :mod:`yard.testing.cluster`, shared with the other cluster
tests and the cluster benchmarks (``bench/claim.py``, ``bench/outage.py``).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from yard.testing.cluster import CHAT, backend_table, running_cluster, submit, wait_ended


async def _wait_running(client: httpx.AsyncClient, job_id: str) -> None:
    """Until the job runs; the caller bounds the wait."""
    while True:
        if (await client.get(f"/v1/jobs/{job_id}")).json()["status"] == "running":
            return
        await trio.sleep(0.05)


@pytest.mark.slow
async def test_one_priority_order_holds_across_nodes(postgres_dsn: str, tmp_path: Path) -> None:
    served = tmp_path / "served.txt"
    llm = backend_table("llm", ["tiny"], service_time=1.0, counter_file=str(served))
    async with running_cluster(postgres_dsn, tmp_path, {"c": llm, "a": llm, "b": llm}) as cluster:
        a, b = cluster.clients["a"], cluster.clients["b"]
        with trio.fail_after(60):
            # c loads the model; a and b then leave its jobs to c (one instance).
            await cluster.load("c", "llm")
            # Nine jobs handed to a and b in turn, priorities shuffled: the
            # first runs on c, then the rest are handed in at once and wait
            # in the shared queue while it runs (c has no room to claim
            # them, and however slowly each arrives, the order is then the
            # priorities'; their ages differ by far less than 10 points).
            priorities = [50, 20, 80, 10, 70, 30, 60, 40, 90]
            ids = [await submit(a, priorities[0]), *[""] * (len(priorities) - 1)]
            await _wait_running(a, ids[0])

            async def hand_in(i: int) -> None:
                ids[i] = await submit((a, b)[i % 2], priorities[i])

            async with trio.open_nursery() as nursery:
                for i in range(1, len(priorities)):
                    nursery.start_soon(hand_in, i)
            still_running = (await a.get(f"/v1/jobs/{ids[0]}")).json()["status"] == "running"
            jobs = await wait_ended(a, ids)
        assert still_running, "the first job ended before the rest were handed in"
        assert [job["status"] for job in jobs] == ["succeeded"] * len(ids)
        order = [line for line in served.read_text().split() if line in ids]
        by_priority = dict(zip(ids, priorities, strict=True))
        assert order[0] == ids[0]
        assert [by_priority[i] for i in order[1:]] == sorted(priorities[1:], reverse=True)


@pytest.mark.slow
async def test_a_sync_request_to_a_node_without_the_model_is_answered_by_the_one_with_it(
    postgres_dsn: str, tmp_path: Path
) -> None:
    only_c = backend_table("big", ["big"], service_time=0.0)
    small = backend_table("small", ["small"])
    async with running_cluster(
        postgres_dsn, tmp_path, {"c": only_c + small, "a": small, "b": small}
    ) as cluster:
        with trio.fail_after(60):
            await cluster.wait_sees("a", ["b", "c"])
            response = await cluster.clients["a"].post(
                "/v1/chat/completions", json={**CHAT, "model": "big"}
            )
        assert response.status_code == 200, response.text
        assert response.headers["x-yard-node"] == "c"
        assert response.json()["choices"][0]["message"]["content"]
        # A streamed answer comes through chunk by chunk, too.
        with trio.fail_after(60):
            async with cluster.clients["a"].stream(
                "POST", "/v1/chat/completions", json={**CHAT, "model": "big", "stream": True}
            ) as stream:
                assert stream.status_code == 200
                chunks = [chunk async for chunk in stream.aiter_bytes()]
        assert b"[DONE]" in b"".join(chunks)


@pytest.mark.slow
async def test_every_node_shows_in_status_dashboard_metrics_and_yard_status(
    postgres_dsn: str, tmp_path: Path
) -> None:
    from rich.console import Console

    from yard.status import render

    llm = backend_table("llm", ["tiny"])
    async with running_cluster(postgres_dsn, tmp_path, {"a": llm, "b": llm}) as cluster:
        a = cluster.clients["a"]
        with trio.fail_after(60):
            await cluster.load("b", "llm")
            await cluster.wait_sees("b", ["a"])
            status = (await a.get("/admin/status")).json()
            metrics = (await a.get("/metrics")).text
            page = (await a.get("/dashboard")).text
        cluster_view = status["cluster"]
        assert cluster_view["node"] == "a"
        assert cluster_view["database"] == "ok"
        nodes = {n["name"]: n for n in cluster_view["nodes"]}
        assert set(nodes) == {"a", "b"}
        assert nodes["b"]["loaded"] == ["llm"]
        assert nodes["b"]["state"] == "up"
        assert 0 <= nodes["b"]["heartbeat_age_s"] < 5
        # /metrics: the node's own series, and the node label on yard's series.
        assert 'yard_node_info{node="a"} 1.0' in metrics
        assert 'yard_node_database_ok{node="a"} 1.0' in metrics
        assert 'yard_cluster_node_up{node="a",peer="b"} 1.0' in metrics
        assert 'yard_submitted_total{node="a"}' in metrics
        assert 'yard_backend_state{backend="llm",node="a",state="stopped"} 1.0' in metrics
        # The dashboard and the terminal show every node.
        assert 'id="nodes"' in page and 'data-node="b"' in page
        console = Console(record=True, width=160)
        render(status, console)
        text = console.export_text()
        assert "Nodes" in text and "a (here)" in text and "llm" in text


@pytest.mark.slow
async def test_a_job_cancelled_on_one_node_stops_running_on_another(
    postgres_dsn: str, tmp_path: Path
) -> None:
    slow = backend_table("llm", ["tiny"], service_time=30.0)
    async with running_cluster(postgres_dsn, tmp_path, {"c": slow, "a": slow}) as cluster:
        a = cluster.clients["a"]
        with trio.fail_after(60):
            await cluster.load("c", "llm")
            first = await submit(a, 50)
            await _wait_status(a, first, "running")
            response = await a.delete(f"/v1/jobs/{first}")
            assert response.status_code == 200, response.text
            # c's one slot is free again long before the 30 s the backend
            # would take: the next job starts there.
            second = await submit(a, 50)
            with trio.fail_after(15):
                await _wait_status(a, second, "running")
        assert (await a.get(f"/v1/jobs/{first}")).json()["status"] == "cancelled"


async def _wait_status(client: httpx.AsyncClient, job_id: str, status: str) -> None:
    while True:
        if (await client.get(f"/v1/jobs/{job_id}")).json()["status"] == status:
            return
        await trio.sleep(0.05)
