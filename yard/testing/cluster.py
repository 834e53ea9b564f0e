"""Real ``yard serve`` nodes on loopback sharing one PostgreSQL database, with
real test backends: the harness of the cluster tests (``tests/cluster``) and
the cluster benchmarks (``bench/claim.py``, ``bench/outage.py``).

:func:`running_cluster` starts the nodes, each healthy, and stops them
(SIGTERM, then SIGKILL after 30 s) on the way out; :class:`Cluster` starts,
kills and stops one node and waits for what nodes see of each other. Every
wait is bounded by its caller (``trio.fail_after``). The database is the
caller's: :func:`yard.testing.postgres.start_postgres` starts a real one.
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
import trio

from yard.testing.backend import backend_command
from yard.testing.client import PlainBody

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
        if response.status_code != 202:
            raise RuntimeError(f"{name} did not take the load: {response.text}")
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

    async def close(self) -> None:
        """Stop every node and close every client (shielded: it runs on the way out)."""
        with trio.CancelScope(shield=True):
            for name in self.nodes:
                await self.stop(name)
            for client in self.clients.values():
                await client.aclose()


async def _plain_body(request: httpx.Request) -> None:
    """Send an in-memory body (``json=``, ``content=``) without an async
    generator: a node killed under the request then leaves nothing for the
    collector to warn about later, under ``filterwarnings = error``
    (:mod:`yard.testing.client`). Multipart uploads stay as they are."""
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
        await cluster.close()


async def submit(client: httpx.AsyncClient, priority: float, **extra: str) -> str:
    response = await client.post(
        "/v1/chat/completions",
        json=CHAT,
        headers={"prefer": "respond-async", "x-yard-priority": str(priority), **extra},
    )
    if response.status_code != 202:
        raise RuntimeError(f"the job was not accepted: {response.status_code} {response.text}")
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
