"""Claim latency through real yard nodes: ``python -m bench.claim``.

Two ``yard serve`` nodes on loopback share one PostgreSQL. Node ``b`` has the
model loaded (the test backend, answering at once); node ``a`` serves the same
backend but leaves its jobs to ``b``, which has it loaded. One job at a time is
handed in on ``a`` (``Prefer: respond-async``); the figure is the time from the
client sending it to ``b`` dispatching it (its ``started_at``, written as ``b``
marks it running, just before the request goes to the backend): the HTTP
request, the insert and ``NOTIFY`` on ``a``, the wake-up, claim and enqueue on
``b``, its engine's dispatch and the write that marks it running. p50 and p99
over ``--jobs`` jobs (300 by default), after ``--warmup`` unmeasured ones.

Target (issue 13): p50 under 20 ms on loopback. The machine's load average is
printed beside the figures: on a shared 2-core machine they are noisy.

Without ``--dsn`` it starts a throw-away PostgreSQL of its own (as the cluster
tests do) and stops it after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import trio

TARGET_P50_MS = 20.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _started_at(dsn: str, job_id: str) -> float:
    """``started_at`` of the job once it has one (polled off the event loop)."""

    def read() -> float | None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT started_at FROM jobs WHERE id = %s", (job_id,)).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    while True:
        found = await trio.to_thread.run_sync(read)
        if found is not None:
            return found
        await trio.sleep(0.01)


async def measure(dsn: str, jobs: int, warmup: int) -> dict[str, object]:
    """Run the two nodes against ``dsn`` (a fresh database) and return the figures."""
    from yard.testing.cluster import CHAT, backend_table, running_cluster

    llm = backend_table("llm", ["tiny"], slots=4)
    with tempfile.TemporaryDirectory(prefix="yard-bench-claim-") as root:
        async with running_cluster(dsn, Path(root), {"b": llm, "a": llm}) as cluster:
            with trio.fail_after(120):
                await cluster.load("b", "llm")
            a = cluster.clients["a"]
            latencies: list[float] = []
            with trio.fail_after(60 + jobs):
                for i in range(warmup + jobs):
                    sent = time.time()
                    response = await a.post(
                        "/v1/chat/completions", json=CHAT, headers={"prefer": "respond-async"}
                    )
                    if response.status_code != 202:
                        raise RuntimeError(f"not accepted: {response.status_code} {response.text}")
                    started = await _started_at(dsn, str(response.json()["id"]))
                    if i >= warmup:
                        latencies.append((started - sent) * 1000.0)
            claimed_by = await trio.to_thread.run_sync(_claimers, dsn)
    p50 = statistics.median(latencies)
    return {
        "jobs": len(latencies),
        "p50_ms": round(p50, 2),
        "p99_ms": round(_percentile(latencies, 0.99), 2),
        "min_ms": round(min(latencies), 2),
        "claimed_by": claimed_by,
        "target_p50_ms": TARGET_P50_MS,
        "met": p50 < TARGET_P50_MS,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _claimers(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT claimed_by, count(*) FROM jobs GROUP BY claimed_by").fetchall()
    return {str(who): int(n) for who, n in rows}


@contextlib.contextmanager
def _own_server() -> Iterator[str]:
    from yard.testing.postgres import start_postgres

    with start_postgres() as server:
        name = server.create_database()
        yield server.dsn(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.claim", description=__doc__)
    parser.add_argument("--dsn", help="an empty PostgreSQL database (default: start one)")
    parser.add_argument("--jobs", type=int, default=300, help="measured jobs (default 300)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured jobs first")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        dsn = args.dsn or stack.enter_context(_own_server())
        figures = trio.run(measure, dsn, args.jobs, args.warmup)
    print(json.dumps(figures))
    return 0 if figures["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
