"""Two nodes through outages of their database: ``python -m bench.outage``.

The reproduction of issue 26. Two ``yard serve`` nodes on loopback share one
PostgreSQL, with the default timings (``heartbeat_s`` 2, ``dead_after_s``
10); node ``b`` starts a second after ``a``, so that their heartbeats are out
of phase. Each run: one 4 s job running on each node, then the database
stopped (as a crash) for the outage, then started again. During the outage
both nodes are asked, every 0.25 s, to take a job and to read one. The
figures, per outage length (10, 12 and 20 s by default, ``--runs`` each):

- ``reaped``: live nodes taken for dead (the nodes' logs, "taken as gone");
- ``lost``: jobs that did not end ``succeeded`` with their backend's answer;
- ``answers``, ``server_errors``: answers during the outage, and those with a
  status of 500 or more that is not a 503 refusal;
- ``bad_refusals``: 503s without JSON, an error code or ``Retry-After``.

Target: 0 reaped, 0 lost, 0 server errors, 0 bad refusals. It starts a
throw-away PostgreSQL of its own (as the cluster tests do). The nodes live
through every run; a run takes the outage plus about 20 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

HEARTBEAT_S = 2.0
DEAD_AFTER_S = 10.0
SERVICE_S = 4.0


async def _job(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    return dict((await client.get(f"/v1/jobs/{job_id}")).json())


async def _probe(clients: list[httpx.AsyncClient], job_id: str, seen: dict[str, int]) -> None:
    from yard.testing.cluster import CHAT

    while True:
        for client in clients:
            for response in (
                await client.post(
                    "/v1/chat/completions", json=CHAT, headers={"prefer": "respond-async"}
                ),
                await client.get(f"/v1/jobs/{job_id}"),
            ):
                seen["answers"] += 1
                status = response.status_code
                if status >= 500 and status != 503:
                    seen["server_errors"] += 1
                elif status == 503:
                    try:
                        error = response.json().get("error")
                    except ValueError:
                        error = None
                    if (
                        not isinstance(error, dict)
                        or not error.get("code")
                        or "retry-after" not in response.headers
                    ):
                        seen["bad_refusals"] += 1
        await trio.sleep(0.25)


def _gone_lines(root: Path) -> int:
    return sum(
        path.read_text(errors="replace").count("taken as gone")
        for path in root.glob("*/yard-*.log")
    )


async def one_run(cluster: Any, server: Any, root: Path, outage_s: float) -> dict[str, int]:
    """One outage of ``outage_s`` with a job running on each node."""
    from yard.testing.cluster import submit

    a, b = cluster.clients["a"], cluster.clients["b"]
    seen = {"answers": 0, "server_errors": 0, "bad_refusals": 0}
    gone_before = _gone_lines(root)
    with trio.fail_after(120):
        jobs: list[str] = []
        for _ in ("a", "b"):
            jobs.append(await submit(a, 50))
            while True:
                if (await _job(a, jobs[-1]))["status"] == "running":
                    break
                await trio.sleep(0.05)
    await trio.to_thread.run_sync(server.stop)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_probe, [a, b], jobs[0], seen)
            await trio.sleep(outage_s)
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(server.start)
    with trio.fail_after(180):
        ended: list[dict[str, Any]] = []
        for job_id in jobs:
            while True:
                job = await _job(b, job_id)
                if job.get("status") not in ("queued", "running", None):
                    ended.append(job)
                    break
                await trio.sleep(0.25)
        # Long enough for any node to have judged the other.
        await trio.sleep(DEAD_AFTER_S + 2 * HEARTBEAT_S)
        results = [await a.get(f"/v1/jobs/{job_id}/result") for job_id in jobs]
    lost = sum(
        1
        for job, result in zip(ended, results, strict=True)
        if job["status"] != "succeeded" or result.status_code != 200 or not result.content
    )
    return {"reaped": _gone_lines(root) - gone_before, "lost": lost, **seen}


async def measure(outages: list[float], runs: int) -> dict[str, Any]:
    from yard.testing.cluster import Cluster, NodeProcess, backend_table, free_port
    from yard.testing.postgres import start_postgres

    llm = backend_table("llm", ["tiny"], service_time=SERVICE_S)
    figures: dict[str, Any] = {}
    with start_postgres() as server, tempfile.TemporaryDirectory(prefix="yard-outage-") as tmp:
        root = Path(tmp)
        dsn = server.dsn(server.create_database())
        nodes = {
            name: NodeProcess(name=name, port=free_port(), root=root / name, backends=llm)
            for name in ("a", "b")
        }
        cluster = Cluster(
            dsn=dsn,
            nodes=nodes,
            cluster_keys={"heartbeat_s": HEARTBEAT_S, "dead_after_s": DEAD_AFTER_S},
        )
        try:
            for name in nodes:
                cluster.clients[name] = httpx.AsyncClient(base_url=nodes[name].url, timeout=60.0)
                await cluster.start(name)
                await trio.sleep(1.0)  # heartbeats out of phase
            with trio.fail_after(120):
                for name in nodes:
                    await cluster.wait_healthy(name)
                await cluster.load("a", "llm")
                await cluster.load("b", "llm")
            for outage_s in outages:
                total: dict[str, int] = {}
                for run in range(runs):
                    started = time.monotonic()
                    got = await one_run(cluster, server, root, outage_s)
                    print(
                        f"outage {outage_s:g} s run {run + 1}: {json.dumps(got)} "
                        f"({time.monotonic() - started:.0f} s)",
                        file=sys.stderr,
                    )
                    for key, value in got.items():
                        total[key] = total.get(key, 0) + value
                figures[f"{outage_s:g}s"] = {"runs": runs, **total}
        finally:
            await cluster.close()
    figures["met"] = all(
        v["reaped"] == v["lost"] == v["server_errors"] == v["bad_refusals"] == 0
        for k, v in figures.items()
        if k.endswith("s")
    )
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.outage", description=__doc__)
    parser.add_argument("--outages", default="10,12,20", help="outage lengths, s (10,12,20)")
    parser.add_argument("--runs", type=int, default=5, help="runs per outage length (5)")
    args = parser.parse_args(argv)
    outages = [float(x) for x in args.outages.split(",")]
    figures = trio.run(measure, outages, args.runs)
    print(json.dumps(figures))
    return 0 if figures["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
