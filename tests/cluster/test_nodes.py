"""Three real ``yard serve`` nodes on loopback, one real PostgreSQL, real test
backends: one priority order across nodes, and a synchronous request sent to a
node without the model answered through the node that has it.

The harness (:class:`Cluster`) is shared with the SIGKILL test
(``test_nodes_kill.py``) and the claim benchmark (``bench/claim.py``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.jobs.client import PlainBody
from yard.testing.backend import backend_command

SECRET = "test-cluster-secret"
HEALTHY_WITHIN_S = 60.0  # a node answers /healthz (a loaded 2-core machine)
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def backend_table(name: str, models: Sequence[str], *, slots: int = 1, **switches: object) -> str:
    """A ``[backends.NAME]`` table running the test backend with ``switches``."""
    return (
        f"[backends.{name}]\ncommand = {json.dumps(backend_command(**switches))}\n"
        f"models = {json.dumps(list(models))}\nslots = {slots}\nstartup_timeout_s = 30\n"
    )


@dataclass
class NodeProcess:
    """One ``yard serve`` of the cluster (started and stopped by :class:`Cluster`)."""

    name: str
    port: int
    root: Path
    backends: str
    process: trio.Process | None = None
    lives: int = 0
    extra: Mapping[str, object] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def write_config(self, dsn: str, cluster: Mapping[str, object]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        merged = {**cluster, **self.extra}
        keys = "".join(f"{key} = {json.dumps(value)}\n" for key, value in merged.items())
        path = self.root / "yard.toml"
        path.write_text(
            f'[server]\nlisten = "127.0.0.1:{self.port}"\ndata_dir = "{self.data_dir}"\n'
            "stop_grace_s = 1\n\n[jobs]\nmax_jobs_per_app = 100000\n\n"
            f'[cluster]\ndatabase = "{dsn}"\nnode = "{self.name}"\nsecret = "{SECRET}"\n'
            + keys
            + "\n"
            + self.backends
        )
        return path

    def kill_backends(self) -> None:
        """Best-effort: SIGKILL to backend groups a killed node left behind."""
        for pid_file in (self.data_dir / "run").glob("*.pid"):
            try:
                os.killpg(int(json.loads(pid_file.read_text())["pgid"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError, TypeError):
                continue


@dataclass
class Cluster:
    """Nodes sharing one database; ``clients[name]`` talks to each."""

    dsn: str
    nodes: dict[str, NodeProcess]
    cluster_keys: Mapping[str, object]
    clients: dict[str, httpx.AsyncClient] = field(default_factory=dict)

    async def start(self, name: str) -> None:
        node = self.nodes[name]
        path = node.write_config(self.dsn, self.cluster_keys)
        log = os.open(
            node.root / f"yard-{node.lives}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
        )
        try:
            node.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "yard.cli", "serve", "--config", str(path)],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            os.close(log)
        node.lives += 1

    async def wait_healthy(self, name: str) -> dict[str, Any]:
        """/healthz of a node once it answers; the caller bounds the wait."""
        client = self.clients[name]
        while True:
            try:
                response = await client.get("/healthz", timeout=5.0)
                if response.status_code == 200:
                    return dict(response.json())
            except httpx.TransportError:
                pass
            await trio.sleep(0.05)

    async def wait_sees(self, name: str, others: Sequence[str], loaded: str | None = None) -> None:
        """Until node ``name`` lists every one of ``others`` as up (and, with
        ``loaded``, having that backend loaded); the caller bounds the wait."""
        while True:
            health = await self.wait_healthy(name)
            nodes = {n["name"]: n for n in health.get("nodes", [])}
            if all(
                o in nodes
                and nodes[o]["state"] == "up"
                and (loaded is None or loaded in nodes[o]["loaded"])
                for o in others
            ):
                return
            await trio.sleep(0.1)

    async def load(self, name: str, backend: str) -> None:
        """Load ``backend`` on node ``name`` (the admin API) and return once
        every other node sees it loaded there; the caller bounds the wait."""
        response = await self.clients[name].post(f"/admin/backends/{backend}/load")
        assert response.status_code == 202, response.text
        for other in self.nodes:
            if other != name:
                await self.wait_sees(other, [name], loaded=backend)

    def kill(self, name: str) -> None:
        node = self.nodes[name]
        if node.process is not None and node.process.returncode is None:
            node.process.kill()

    async def stop(self, name: str) -> None:
        node = self.nodes[name]
        if node.process is not None and node.process.returncode is None:
            node.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(30):
                await node.process.wait()
            node.process.kill()
            await node.process.wait()
        node.kill_backends()


async def _plain_body(request: httpx.Request) -> None:
    """Send an in-memory body (``json=``, ``content=``) without an async
    generator: a node killed under the request then leaves nothing for the
    collector to warn about later, under ``filterwarnings = error``
    (:mod:`tests.jobs.client`). Multipart uploads stay as they are."""
    if isinstance(request.stream, httpx.ByteStream):
        request.stream = PlainBody(request.content)


@asynccontextmanager
async def running_cluster(
    dsn: str,
    root: Path,
    backends: Mapping[str, str],
    *,
    heartbeat_s: float = 0.5,
    dead_after_s: float = 1.5,
    extra: Mapping[str, Mapping[str, object]] | None = None,
) -> AsyncIterator[Cluster]:
    """Nodes named by ``backends`` (name -> their ``[backends]`` tables),
    started in that order, each healthy; stopped (SIGTERM) on the way out.
    ``extra``: more ``[cluster]`` keys for some nodes (name -> keys)."""
    nodes = {
        name: NodeProcess(
            name=name,
            port=free_port(),
            root=root / name,
            backends=tables,
            extra=(extra or {}).get(name, {}),
        )
        for name, tables in backends.items()
    }
    cluster = Cluster(
        dsn=dsn,
        nodes=nodes,
        cluster_keys={"heartbeat_s": heartbeat_s, "dead_after_s": dead_after_s},
    )
    try:
        for node in nodes.values():
            cluster.clients[node.name] = httpx.AsyncClient(
                base_url=node.url, timeout=30.0, event_hooks={"request": [_plain_body]}
            )
            await cluster.start(node.name)
        with trio.fail_after(HEALTHY_WITHIN_S):
            for name in nodes:
                await cluster.wait_healthy(name)
        yield cluster
    finally:
        with trio.CancelScope(shield=True):
            for name in nodes:
                await cluster.stop(name)
            for client in cluster.clients.values():
                await client.aclose()


async def submit(client: httpx.AsyncClient, priority: float, **extra: str) -> str:
    response = await client.post(
        "/v1/chat/completions",
        json=CHAT,
        headers={"prefer": "respond-async", "x-yard-priority": str(priority), **extra},
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def wait_ended(client: httpx.AsyncClient, job_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Every job once it has ended; the caller bounds the wait."""
    ended = []
    for job_id in job_ids:
        while True:
            job = (await client.get(f"/v1/jobs/{job_id}", params={"wait": "5"})).json()
            if job["status"] not in ("queued", "running"):
                ended.append(job)
                break
    return ended


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
