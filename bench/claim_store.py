"""The bare claim round trip through PostgreSQL: ``python -m bench.claim_store``.

One round: node A hands a job in (``INSERT`` + ``NOTIFY`` in one
transaction, on A's connections); node B, waiting on its listener (its own
connection), wakes and claims it (``FOR UPDATE SKIP LOCKED``, on B's
connections). The figure is the time from the start of A's insert to B
holding the job, p50 and p99 over ``--rounds`` rounds (500 by default),
with the insert and the wake-up alone beside it. This is the store's share
of issue 13's claim latency (target: p50 under 20 ms end to end); the figure
through real yard nodes is ``bench/claim.py``'s.

Without ``--dsn`` it starts a throw-away PostgreSQL of its own (as the
cluster tests do: Debian's, on 127.0.0.1) and stops it after.
``--socket`` uses that server's Unix socket instead of TCP loopback;
``--durable`` keeps its fsync on (as a real server: each commit is synced);
``--backlog N`` measures with N jobs already waiting.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from collections.abc import Iterator

import trio
import trio.testing

from yard.cluster.jobs import ClusterJobStore
from yard.cluster.listen import Listener
from yard.cluster.pg import PgDatabase
from yard.cluster.schema import JOBS_CHANNEL, MIGRATIONS
from yard.jobs.records import StoredRequest

REQUEST = StoredRequest(
    method="POST",
    path="/v1/audio/speech",
    query="",
    headers=((b"content-type", b"application/json"),),
    body=b'{"model": "voice", "input": "the 14:00 announcement"}',
)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(dsn: str, rounds: int, backlog: int = 0) -> dict[str, object]:
    """Run the rounds against ``dsn`` (a fresh database) and return the figures.

    backlog: jobs already waiting: half for a backend node B does not serve,
    ranked above every measured job (the claim walks past them), half for its
    backend, ranked below (they stay behind)."""
    db_a = await PgDatabase.open(dsn, MIGRATIONS, application_name="bench node a")
    db_b = await PgDatabase.open(dsn, MIGRATIONS, application_name="bench node b")
    if backlog:
        await db_a.execute(
            "INSERT INTO jobs (id, app, model, backend, priority, status, created_at, rank, "
            "origin) SELECT 'backlog-' || g, 'bench', 'm', "
            "CASE WHEN g % 2 = 0 THEN 'music' ELSE 'tts' END, 0, 'queued', 0, "
            "CASE WHEN g % 2 = 0 THEN 1000 ELSE -1000 END, 'a' "
            "FROM generate_series(1, ?) g",
            (backlog,),
        )
        await db_a.execute("ANALYZE jobs")
    a = ClusterJobStore(db_a, node="a")
    b = ClusterJobStore(db_b, node="b")
    total: list[float] = []
    insert: list[float] = []
    wake: list[float] = []
    misses = 0
    try:
        async with Listener(dsn, channels=(JOBS_CHANNEL,)) as listener:
            for i in range(rounds + 20):  # the first 20 warm the connections up
                claimed: list[str] = []
                woke_at: list[float] = []

                async def claimer(into: list[str], woke: list[float]) -> None:
                    while not into:
                        await listener.wait()
                        woke.append(trio.current_time())
                        job = await b.claim("b", ("tts",))
                        if job is not None:
                            into.append(job.id)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(claimer, claimed, woke_at)
                    await trio.testing.wait_all_tasks_blocked()
                    start = trio.current_time()
                    await a.insert(
                        job_id=f"job-{i}",
                        app="bench",
                        model="voice",
                        backend="tts",
                        priority=0.0,
                        start_by=None,
                        allow_late=False,
                        rerun_safe=False,
                        created_at=float(i),
                        request=REQUEST,
                    )
                    inserted = trio.current_time()
                end = trio.current_time()
                if i < 20:
                    continue
                misses += len(woke_at) - 1
                total.append(end - start)
                insert.append(inserted - start)
                wake.append(woke_at[0] - start)
    finally:
        await a.close()
        await b.close()

    def ms(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": round(1000 * statistics.median(values), 3),
            "p99_ms": round(1000 * _percentile(values, 0.99), 3),
            "max_ms": round(1000 * max(values), 3),
        }

    return {
        "rounds": rounds,
        "backlog": backlog,
        "insert_to_claimed": ms(total),
        "insert_alone": ms(insert),
        "insert_to_listener_awake": ms(wake),
        "wakeups_without_a_job": misses,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


@contextlib.contextmanager
def _server(socket: bool, durable: bool) -> Iterator[str]:
    # The test fixtures' server: a throw-away PostgreSQL on this machine.
    from yard.testing.postgres import start_postgres

    with start_postgres(durable=durable) as server:
        name = server.create_database()
        yield server.socket_dsn(name) if socket else server.dsn(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_store", description=__doc__)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--dsn", help="an empty PostgreSQL database to use (default: start one)")
    parser.add_argument("--socket", action="store_true", help="the Unix socket, not TCP")
    parser.add_argument(
        "--durable", action="store_true", help="the started server syncs commits (fsync on)"
    )
    parser.add_argument(
        "--backlog", type=int, default=0, help="jobs already waiting (see measure())"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.dsn:
        figures = trio.run(measure, args.dsn, args.rounds, args.backlog)
        figures["transport"] = "given dsn"
    else:
        with _server(args.socket, args.durable) as dsn:
            figures = trio.run(measure, dsn, args.rounds, args.backlog)
        figures["transport"] = "unix socket" if args.socket else "tcp 127.0.0.1"
        figures["fsync"] = args.durable
    json.dump(figures, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
