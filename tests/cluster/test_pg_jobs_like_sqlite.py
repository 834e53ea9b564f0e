"""ClusterJobStore against the SQLite JobStore: the same random sequence of
operations on both gives the same answers and the same jobs, except where
the cluster store differs on purpose (listed in ``differs``)."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

import trio

from yard.cluster.jobs import ClusterJobStore
from yard.cluster.pg import PgDatabase
from yard.cluster.schema import MIGRATIONS
from yard.jobs.records import (
    STATUSES,
    JobError,
    JobRecord,
    Quota,
    QuotaExceeded,
    Status,
    StoredRequest,
    StoredResult,
)
from yard.jobs.store import JobStore

SEED = 1300
OPERATIONS = 300
WEIGHTS = {
    "insert": 6,
    "run": 5,
    "finish": 3,
    "requeue": 2,
    "rerun": 2,
    "spent": 1,
    "forget": 1,
    "expire": 1,
    "purge": 1,
    "delete": 0.3,
}
"""How often each operation is drawn."""


def _comparable(job: JobRecord | None) -> JobRecord | None:
    # seq counts differently (PostgreSQL spends a value on a refused insert).
    return None if job is None else dataclasses.replace(job, seq=0)


async def test_the_cluster_store_answers_like_the_sqlite_store(
    postgres_dsn: str, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    sqlite = await JobStore.open(tmp_path / "jobs.sqlite")
    pg = ClusterJobStore(await PgDatabase.open(postgres_dsn, MIGRATIONS), node="n1")
    stores: tuple[JobStore, JobStore] = (sqlite, pg)
    ids: list[str] = []
    quota = Quota(max_jobs=12, max_bytes=3000)
    clock = 1000.0
    seen: Counter[str] = Counter()
    try:
        with trio.fail_after(120):
            for step in range(OPERATIONS):
                clock += rng.choice((0.5, 1.0, 7.0))
                op = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
                job_id = f"j{step}" if op == "insert" else rng.choice(ids[-8:] or ["none"])
                draws = rng.randrange(2**32)  # the same values for both stores
                answers = [await apply(s, op, job_id, draws, clock, quota) for s in stores]
                if op == "insert" and answers[0] == "ok":
                    ids.append(job_id)
                if isinstance(answers[0], tuple):
                    seen["quota"] += 1
                else:
                    seen[op if answers[0] not in (False, None, []) else f"{op} (no)"] += 1
                label = f"step {step}: {op} {job_id} (seed {SEED})"
                if op == "run" and answers[0] is True and answers[1] is False:
                    # Differs on purpose: PostgreSQL starts a job only from
                    # queued (a node holding a job twice runs it once).
                    before = await sqlite.get(job_id)
                    assert before is not None and before.status == "running", label
                    await pg_force_running(pg, job_id, clock)
                else:
                    assert answers[0] == answers[1], label
                for jid in {ids[-1] if ids else job_id, job_id}:
                    assert _comparable(await sqlite.get(jid)) == _comparable(await pg.get(jid)), (
                        label,
                        jid,
                    )
            # The sequence reached every kind of answer worth comparing.
            for kind in (
                "quota",
                "insert",
                "run",
                "run (no)",
                "finish",
                "finish (no)",
                "requeue",
                "rerun",
                "forget",
                "expire",
                "purge",
            ):
                assert seen[kind] > 0, (kind, seen)
            assert await sqlite.counts() == await pg.counts()
            assert set(STATUSES) == set(await pg.counts())
            for jid in ids:
                assert _comparable(await sqlite.get(jid)) == _comparable(await pg.get(jid)), jid
                assert await sqlite.request(jid) == await pg.request(jid), jid
                assert await sqlite.result(jid) == await pg.result(jid), jid
            assert await sqlite.usage("radio") == await pg.usage("radio")
            assert [j.id for j in await sqlite.list_jobs(app=None, limit=500)] == [
                j.id for j in await pg.list_jobs(app=None, limit=500)
            ]
            # Differs on purpose: a restart of a node restores only the jobs
            # it holds (it ran them); the shared queue is claimed instead.
            held = [j.id for j in await sqlite.unfinished() if j.started_at is not None]
            assert [j.id for j in await pg.unfinished() if j.started_at is not None] == held
    finally:
        await sqlite.close()
        await pg.close()


async def pg_force_running(pg: ClusterJobStore, job_id: str, at: float) -> None:
    """Bring the PostgreSQL job to what SQLite did (running again, restarted
    at ``at``), so that the comparison goes on."""
    await pg.database.execute(
        "UPDATE jobs SET started_at = ?, queued_s = 1.5 WHERE id = ?", (at, job_id)
    )


async def apply(
    store: JobStore,
    op: str,
    job_id: str,
    draws: int,
    clock: float,
    quota: Quota,
) -> object:
    """Run ``op`` on ``store``, drawing its arguments from ``draws`` (a seed,
    so that both stores get the same); return what the store answered."""
    rng = random.Random(draws)
    if op == "insert":
        size = rng.randrange(50, 400)
        try:
            await store.insert(
                job_id=job_id,
                app="radio",
                model="voice",
                backend=rng.choice(("tts", "llm")),
                priority=float(rng.randrange(10)),
                start_by=rng.choice((None, clock + 60)),
                allow_late=rng.random() < 0.5,
                rerun_safe=rng.random() < 0.5,
                created_at=clock,
                request=StoredRequest(
                    method="POST",
                    path="/v1/audio/speech",
                    query="",
                    headers=((b"x-n", str(size).encode()),),
                    body=b"x" * size,
                ),
                quota=quota,
                not_before=rng.choice((None, clock + 5)),
            )
        except QuotaExceeded as exc:
            return ("quota", exc.usage)
        return "ok"
    if op == "run":
        return await store.mark_running(job_id, at=clock, queued_s=1.5)
    if op == "finish":
        status: Status = rng.choice(("succeeded", "failed", "cancelled"))
        if status == "succeeded":
            headers = ((b"content-type", b"audio/wav"),)
            result = StoredResult(status=200, headers=headers, body=b"RIFF")
            return await store.finish(job_id, status, at=clock, result=result)
        error = JobError(code=status, message=f"it {status}", status=500)
        return await store.finish(job_id, status, at=clock, error=error)
    if op == "requeue":
        return await store.mark_requeued(job_id)
    if op == "rerun":
        return await store.mark_rerun(job_id)
    if op == "spent":
        await store.mark_requeue_spent(job_id)
        return None
    if op == "forget":
        return await store.forget_result(job_id)
    if op == "expire":
        return sorted(await store.expire(finished_before=clock - 20))
    if op == "purge":
        return await store.purge(finished_before=clock - 40)
    assert op == "delete"
    await store.delete(job_id)
    return None
