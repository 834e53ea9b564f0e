"""ClusterJobStore against a real PostgreSQL: the SQLite store's behaviour, one
priority order across nodes, claims that never collide, reaping a dead node."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest
import trio
import trio.lowlevel

from yard.cluster.jobs import ClusterJobStore, rank_of
from yard.cluster.pg import PgDatabase
from yard.cluster.schema import MIGRATIONS
from yard.jobs.records import JobError, Quota, QuotaExceeded, StoredRequest, StoredResult
from yard.jobs.restore import INTERRUPTED

REQUEST = StoredRequest(
    method="POST",
    path="/v1/audio/speech",
    query="format=wav",
    headers=((b"content-type", b"application/json"), (b"x-odd", b"caf\xe9")),
    body=b'{"input": "hi"}',
)
RESULT = StoredResult(status=200, headers=((b"content-type", b"audio/wav"),), body=b"RIFF\x00")

Stores = Callable[[str], Awaitable[ClusterJobStore]]


@pytest.fixture
async def stores(postgres_dsn: str) -> AsyncIterator[Stores]:
    """Opens the store of a node (its own connections) on one database."""
    opened: list[ClusterJobStore] = []

    async def open_store(node: str) -> ClusterJobStore:
        db = await PgDatabase.open(postgres_dsn, MIGRATIONS, application_name=node)
        opened.append(ClusterJobStore(db, node=node, aging_rate=0.1))
        return opened[-1]

    try:
        yield open_store
    finally:
        for store in opened:
            await store.close()


async def add(
    store: ClusterJobStore,
    job_id: str,
    *,
    at: float = 100.0,
    priority: float = 50.0,
    backend: str = "tts",
    rerun_safe: bool = False,
    quota: Quota | None = None,
) -> None:
    await store.insert(
        job_id=job_id,
        app="radio",
        model="voice",
        backend=backend,
        priority=priority,
        start_by=None,
        allow_late=False,
        rerun_safe=rerun_safe,
        created_at=at,
        request=REQUEST,
        quota=quota,
    )


async def claim_all(store: ClusterJobStore, node: str, backends: tuple[str, ...]) -> list[str]:
    claimed: list[str] = []
    while (job := await store.claim(node, backends)) is not None:
        claimed.append(job.id)
    return claimed


# -- what the SQLite store does ------------------------------------------------


async def test_the_request_and_result_come_back_exactly_as_stored(stores: Stores) -> None:
    store = await stores("n1")
    await add(store, "a")
    assert await store.request("a") == REQUEST
    assert await store.mark_running("a", at=101.0, queued_s=1.0)
    assert await store.finish("a", "succeeded", at=102.0, result=RESULT)
    assert await store.result("a") == RESULT
    assert await store.request("a") is None
    job = await store.get("a")
    assert job is not None
    assert (job.status, job.result_status, job.result_bytes, job.result_type) == (
        "succeeded",
        200,
        5,
        "audio/wav",
    )
    assert (job.started_at, job.finished_at, job.queued_s) == (101.0, 102.0, 1.0)


async def test_a_job_ends_once_and_the_first_end_wins(stores: Stores) -> None:
    store = await stores("n1")
    await add(store, "a")
    cancelled = JobError(code="cancelled", message="bye", status=499)
    assert await store.finish("a", "cancelled", at=110.0, error=cancelled)
    assert not await store.finish("a", "succeeded", at=111.0, result=RESULT)
    assert not await store.mark_running("a", at=112.0, queued_s=1.0)
    job = await store.get("a")
    assert job is not None
    assert (job.status, job.finished_at, job.error) == ("cancelled", 110.0, cancelled)
    assert await store.result("a") is None
    assert await store.request("a") is None
    with pytest.raises(ValueError, match="final status"):
        await store.finish("a", "running", at=1.0)


async def test_expiry_forgetting_and_purging_follow_the_sqlite_store(stores: Stores) -> None:
    store = await stores("n1")
    for job_id, at in (("old", 100.0), ("new", 200.0), ("waiting", 50.0), ("read", 60.0)):
        await add(store, job_id, at=at)
    await store.finish("old", "succeeded", at=150.0, result=RESULT)
    await store.finish("new", "succeeded", at=250.0, result=RESULT)
    await store.finish("read", "succeeded", at=260.0, result=RESULT)
    assert not await store.forget_result("waiting")
    assert await store.forget_result("read")
    assert await store.result("read") is None
    assert await store.expire(finished_before=200.0) == ["old"]
    assert await store.result("old") is None
    assert await store.result("new") == RESULT
    assert await store.counts() == {
        "queued": 1,
        "running": 0,
        "succeeded": 1,
        "failed": 0,
        "cancelled": 0,
        "expired": 2,
    }
    assert await store.purge(finished_before=151.0) == 1
    assert await store.get("old") is None
    assert await store.get("waiting") is not None


async def test_requeue_and_rerun_flags_move_as_in_sqlite(stores: Stores) -> None:
    store = await stores("n1")
    await add(store, "oom")
    await add(store, "safe", rerun_safe=True)
    assert not await store.mark_requeued("oom")  # not running
    assert await store.mark_running("oom", at=101.0, queued_s=1.0)
    await store.mark_requeue_spent("oom")
    assert await store.mark_requeued("oom")
    assert await store.mark_running("safe", at=101.0, queued_s=1.0)
    assert await store.mark_rerun("safe")
    assert await store.mark_running("safe", at=102.0, queued_s=2.0)
    assert not await store.mark_rerun("safe")  # the one rerun is spent
    oom, safe = await store.get("oom"), await store.get("safe")
    assert oom is not None and safe is not None
    assert (oom.status, oom.requeued, oom.started_at) == ("queued", True, None)
    assert (safe.status, safe.rerun_used) == ("running", True)
    # Both are this node's now (it ran them): a restart of it puts them back.
    assert [job.id for job in await store.unfinished()] == ["oom", "safe"]
    await store.delete("oom")
    assert await store.get("oom") is None


async def test_a_node_cannot_mark_requeued_a_job_another_node_runs(stores: Stores) -> None:
    # A node that wrote a requeue late (its database was lost meanwhile, and
    # it was reaped) finds the job running elsewhere: that run is not touched.
    one, two = await stores("n1"), await stores("n2")
    await add(one, "oom")
    assert await two.mark_running("oom", at=101.0, queued_s=1.0)
    assert not await one.mark_requeued("oom")
    job = await one.get("oom")
    assert job is not None and (job.status, job.requeued, job.started_at) == (
        "running",
        False,
        101.0,
    )
    assert await two.mark_requeued("oom")


async def test_listing_filters_by_app_status_and_cursor(stores: Stores) -> None:
    store = await stores("n1")
    for job_id in ("a", "b", "c"):
        await add(store, job_id)
    await store.finish("b", "failed", at=101.0, error=INTERRUPTED)
    newest = await store.list_jobs(app="radio", limit=2)
    assert [job.id for job in newest] == ["c", "b"]
    older = await store.list_jobs(app=None, before_seq=newest[-1].seq)
    assert [job.id for job in older] == ["a"]
    assert [job.id for job in await store.list_jobs(app=None, statuses=("failed",))] == ["b"]
    assert await store.list_jobs(app="other") == []


async def test_the_quota_holds_when_two_nodes_take_in_jobs_at_once(stores: Stores) -> None:
    one, two = await stores("n1"), await stores("n2")
    quota = Quota(max_jobs=5, max_bytes=10_000)
    refused: list[str] = []

    async def hand_in(store: ClusterJobStore, prefix: str) -> None:
        for i in range(8):
            try:
                await add(store, f"{prefix}{i}", quota=quota)
            except QuotaExceeded:
                refused.append(f"{prefix}{i}")

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hand_in, one, "x")
            nursery.start_soon(hand_in, two, "y")
    usage = await one.usage("radio")
    assert (usage.jobs, usage.bytes, usage.oldest_finished_at) == (5, 5 * len(REQUEST.body), None)
    assert len(refused) == 11


# -- one queue -------------------------------------------------------------------


async def test_a_high_rank_job_of_node_1_goes_before_a_lower_one_of_node_2(
    stores: Stores,
) -> None:
    one, two = await stores("n1"), await stores("n2")
    # Handed in to node 2 first, lower priority.
    await add(two, "low", priority=10.0, at=1000.0)
    await add(one, "high", priority=50.0, at=1001.0)
    for claimer in (one, two):
        first = await claimer.claim(claimer.node, ("tts",))
        assert first is not None and first.id == "high"
        await claimer.release("high", claimer.node)
    # Aging, with the rate the stores were given (0.1/s): a job waiting 500 s
    # longer has made up 50 points of priority.
    await add(two, "patient", priority=0.0, at=0.0)
    assert await claim_all(one, "n1", ("tts",)) == ["patient", "high", "low"]
    assert rank_of(0.0, 0.0, 0.1) > rank_of(50.0, 1001.0, 0.1)


async def test_a_loaded_backend_breaks_ties_between_equal_ranks_only(stores: Stores) -> None:
    one = await stores("n1")
    await add(one, "cold", backend="llm", priority=50.0)
    await add(one, "warm", backend="tts", priority=50.0)
    await add(one, "urgent-cold", backend="llm", priority=60.0)
    claimed = []
    while (job := await one.claim("n1", ("llm", "tts"), prefer=("tts",))) is not None:
        claimed.append(job.id)
    assert claimed == ["urgent-cold", "warm", "cold"]


async def test_a_node_claims_only_backends_it_serves(stores: Stores) -> None:
    one = await stores("n1")
    await add(one, "song", backend="music")
    await add(one, "talk", backend="tts")
    assert await one.waiting() == {"music": 1, "tts": 1}
    assert await one.claim("n1", ()) is None
    job = await one.claim("n1", ("tts", "llm"))
    assert job is not None and job.id == "talk"
    assert await one.claim("n1", ("tts", "llm")) is None
    assert await one.waiting(("tts", "music", "llm")) == {"tts": 0, "music": 1, "llm": 0}
    assert [j.id for j in await one.claimed("n1")] == ["talk"]


async def test_claimers_racing_never_get_the_same_job(stores: Stores) -> None:
    nodes = [await stores(f"n{i}") for i in range(3)]
    jobs_per_round = 40
    for round_ in range(5):
        ids = [f"r{round_}-{i}" for i in range(jobs_per_round)]
        for job_id, store in zip(ids, itertools.cycle(nodes), strict=False):
            await add(store, job_id, priority=float(len(job_id) % 3))
        got: dict[str, list[str]] = {}

        async def claimer(store: ClusterJobStore, name: str, into: dict[str, list[str]]) -> None:
            into[name] = await claim_all(store, store.node, ("tts",))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                # Two claimers per node: each store has several connections,
                # so up to six claims are in flight at once.
                for i, store in enumerate(nodes):
                    nursery.start_soon(claimer, store, f"{store.node}a{i}", got)
                    nursery.start_soon(claimer, store, f"{store.node}b{i}", got)
        claimed = [job_id for batch in got.values() for job_id in batch]
        assert sorted(claimed) == sorted(ids), f"round {round_}: {got}"
        assert await nodes[0].waiting() == {}


async def test_release_puts_a_job_back_at_its_old_place(stores: Stores) -> None:
    one, two = await stores("n1"), await stores("n2")
    await add(one, "first", priority=50.0)
    await add(one, "second", priority=40.0)
    job = await one.claim("n1", ("tts",))
    assert job is not None and job.id == "first"
    assert not await two.release("first", "n2")  # not n2's to give back
    assert await one.release("first", "n1")
    assert not await one.release("first", "n1")
    assert await claim_all(two, "n2", ("tts",)) == ["first", "second"]


# -- a dead node ---------------------------------------------------------------------


async def test_reaping_a_dead_node_follows_the_restart_rules(stores: Stores) -> None:
    dead, alive = await stores("dead"), await stores("alive")
    await add(dead, "queued", priority=50.0, at=100.0)
    await add(dead, "running", priority=49.0, at=100.0)
    await add(dead, "safe", priority=48.0, at=100.0, rerun_safe=True)
    await add(dead, "safe-again", priority=47.0, at=100.0, rerun_safe=True)
    await add(alive, "later", priority=45.0, at=100.0)
    assert await claim_all(dead, "dead", ("tts",)) == [
        "queued",
        "running",
        "safe",
        "safe-again",
        "later",
    ]
    assert await dead.release("later", "dead")
    for job_id in ("running", "safe", "safe-again"):
        assert await dead.mark_running(job_id, at=101.0, queued_s=1.0)
    assert await dead.mark_rerun("safe-again")  # its rerun was used by a restart
    assert await dead.mark_running("safe-again", at=102.0, queued_s=2.0)

    summaries = []

    async def reap() -> None:
        summaries.append(await alive.reap("dead", now=200.0))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reap)
            nursery.start_soon(reap)
    winner, loser = sorted(summaries, key=lambda s: -s.total)
    assert loser.total == 0
    assert sorted(winner.released) == ["queued"]
    assert winner.rerun == ("safe",)
    assert sorted(winner.interrupted) == ["running", "safe-again"]
    for job_id in ("running", "safe-again"):
        job = await alive.get(job_id)
        assert job is not None
        assert (job.status, job.error, job.finished_at) == ("failed", INTERRUPTED, 200.0)
        assert await alive.request(job_id) is None
    # Back at their old places: before the job that waited behind them.
    assert await claim_all(alive, "alive", ("tts",)) == ["queued", "safe", "later"]
    # The dead node, come back with its old memory, runs none of them again.
    for job_id in ("queued", "safe"):
        assert not await dead.mark_running(job_id, at=300.0, queued_s=1.0)
    assert await dead.unfinished() == []
    safe = await alive.get("safe")
    assert safe is not None and (safe.rerun_used, safe.status) == (True, "queued")


async def test_a_node_reaped_while_alive_that_claims_a_job_back_runs_it_once(
    stores: Stores,
) -> None:
    node, reaper = await stores("n1"), await stores("reaper")
    await add(node, "j")
    first = await node.claim("n1", ("tts",))  # in the node's queue ...
    assert first is not None
    await reaper.reap("n1", now=200.0)  # ... when the others find it dead
    second = await node.claim("n1", ("tts",))  # it claims it back: held twice
    assert second is not None and second.id == first.id == "j"
    assert await node.mark_running("j", at=201.0, queued_s=1.0)
    assert not await node.mark_running("j", at=202.0, queued_s=2.0)


async def test_a_late_end_from_a_reaped_node_ends_neither_its_old_run_nor_the_rerun(
    stores: Stores,
) -> None:
    a, b = await stores("a"), await stores("b")
    await add(a, "safe", rerun_safe=True)
    await add(a, "once")
    assert await claim_all(a, "a", ("tts",)) == ["safe", "once"]
    for job_id in ("safe", "once"):
        assert await a.mark_running(job_id, at=101.0, queued_s=1.0)
    # a is declared dead while alive: "once" is interrupted, "safe" goes back
    # once, and b runs it now.
    summary = await b.reap("a", now=200.0)
    assert summary.rerun == ("safe",)
    assert summary.interrupted == ("once",)
    assert await claim_all(b, "b", ("tts",)) == ["safe"]
    assert await b.mark_running("safe", at=201.0, queued_s=1.0)
    # a's runners end both, very late: neither end is taken.
    assert not await a.end_run("safe", "succeeded", at=202.0, result=RESULT)
    assert not await a.end_run("once", "succeeded", at=202.0, result=RESULT)
    safe, once = await b.get("safe"), await b.get("once")
    assert safe is not None and (safe.status, safe.started_at) == ("running", 201.0)
    assert once is not None and once.error is not None and once.error.code == "interrupted"
    # b's end, and a cancel from any node, are.
    assert await b.end_run("safe", "succeeded", at=203.0, result=RESULT)
    await add(b, "other")
    cancelled = JobError(code="cancelled", message="bye", status=499)
    assert await a.finish("other", "cancelled", at=204.0, error=cancelled)


async def test_finish_races_cancel_and_exactly_one_wins(stores: Stores) -> None:
    one, two = await stores("n1"), await stores("n2")
    cancelled = JobError(code="cancelled", message="cancelled by the client", status=499)
    outcomes = {"succeeded": 0, "cancelled": 0}
    for i in range(40):
        job_id = f"j{i}"
        await add(one, job_id)
        assert await one.mark_running(job_id, at=101.0, queued_s=1.0)
        won: dict[str, bool] = {}

        async def succeed(jid: str, into: dict[str, bool]) -> None:
            into["succeeded"] = await one.finish(jid, "succeeded", at=102.0, result=RESULT)

        async def cancel(jid: str, into: dict[str, bool]) -> None:
            into["cancelled"] = await two.finish(jid, "cancelled", at=102.0, error=cancelled)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(succeed, job_id, won)
                nursery.start_soon(cancel, job_id, won)
        assert sorted(won.values()) == [False, True], won
        winner = next(status for status, ok in won.items() if ok)
        outcomes[winner] += 1
        job = await two.get(job_id)
        assert job is not None and job.status == winner
        assert (await two.result(job_id) is not None) == (winner == "succeeded")
    assert sum(outcomes.values()) == 40


async def test_a_job_being_claimed_elsewhere_is_skipped_not_waited_for(
    stores: Stores, postgres_dsn: str
) -> None:
    one = await stores("n1")
    await add(one, "top", priority=50.0, backend="tts")
    await add(one, "next", priority=40.0, backend="llm")
    await add(one, "last", priority=30.0, backend="tts")
    # Another node's claim transaction holds "top" locked, not yet committed.
    with psycopg.connect(postgres_dsn) as other:
        other.execute("SELECT 1 FROM jobs WHERE id = 'top' FOR UPDATE")
        with trio.fail_after(5):
            job = await one.claim("n1", ("tts", "llm"), prefer=("tts",))
        assert job is not None and job.id == "next"
        other.rollback()
    assert await claim_all(one, "n1", ("tts", "llm")) == ["top", "last"]


async def test_claimed_at_is_when_the_claim_took_the_job_not_when_its_statement_began(
    stores: Stores, postgres_dsn: str
) -> None:
    """Two nodes claiming at once: the claim stamped first must be the one
    that took its job first (test_node_reap.py compares the stamps of two
    racing nodes). A statement's start is not that: here the claim waits on
    a lock after it began, as a claim delayed by a loaded machine does."""
    one = await stores("n1")
    await add(one, "j1")
    claimed: list[str] = []

    async def claim() -> None:
        job = await one.claim("n1", ("tts",))
        claimed.append("" if job is None else job.id)

    with (
        psycopg.connect(postgres_dsn, autocommit=True) as holder,
        psycopg.connect(postgres_dsn, autocommit=True) as observer,
    ):
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE jobs IN SHARE MODE")  # a claim's UPDATE waits
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(claim)
                await _until(lambda: _lock_waits(observer) > 0)
                # The claim's statement has begun and waits; it takes j1 only now.
                released = time.time()
                holder.execute("COMMIT")
        row = observer.execute("SELECT claimed_at FROM jobs WHERE id = 'j1'").fetchone()
    assert claimed == ["j1"]
    assert row is not None and float(row[0]) >= released


async def _until(done: Callable[[], bool]) -> None:
    """Until ``done()``; the caller bounds the wait."""
    while True:
        if done():
            return
        await trio.sleep(0.01)


def _lock_waits(conn: psycopg.Connection[Any]) -> int:
    """Sessions of this database waiting for a lock now."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'"
    ).fetchone()
    return 0 if row is None else int(row[0])


async def test_nodes_claiming_running_and_dying_at_random_run_no_job_twice(
    stores: Stores,
) -> None:
    """Three nodes claim, give back, run and finish jobs at once, several
    running at a time; now and then one is declared dead and reaped while it
    holds queued and running jobs, and carries on as a node cut off from the
    others would (it tries to run and finish what it still holds). No job
    runs on two nodes (a rerun-safe one at most once more), and every job
    ends exactly once or waits in the shared queue."""
    seed = 1313
    rng = random.Random(seed)
    nodes = [await stores(f"n{i}") for i in range(3)]
    reaper = await stores("reaper")
    total = 80
    for i in range(total):
        await add(nodes[i % 3], f"j{i}", priority=float(rng.randrange(5)), rerun_safe=i % 4 == 0)
    ran: dict[str, list[str]] = {}
    ended: dict[str, int] = {}
    deaths = 0
    actions = 0

    def count_end(job_id: str) -> None:
        ended[job_id] = ended.get(job_id, 0) + 1

    async def run(store: ClusterJobStore, job_id: str) -> None:
        if await store.mark_running(job_id, at=1.0, queued_s=0.0):
            ran.setdefault(job_id, []).append(store.node)
            await trio.sleep(rng.random() / 50)
            if await store.finish(job_id, "succeeded", at=2.0, result=RESULT):
                count_end(job_id)

    async def node_loop(store: ClusterJobStore, nursery: trio.Nursery) -> None:
        nonlocal deaths, actions
        held: list[str] = []
        while True:
            job = await store.claim(store.node, ("tts",))
            if job is not None and job.id not in held:
                held.append(job.id)
            if not held:
                if await reaper.waiting() == {}:
                    return
                await trio.sleep(0.001)
                continue
            actions += 1
            action = rng.random()
            if actions in (10, 30, 50):
                # Declared dead: reaped while it holds and runs jobs.
                deaths += 1
                for job_id in (await reaper.reap(store.node, now=3.0)).interrupted:
                    count_end(job_id)
                continue
            job_id = held.pop(rng.randrange(len(held)))
            if action < 0.2:
                await store.release(job_id, store.node)
            else:
                nursery.start_soon(run, store, job_id)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for store in nodes:
                nursery.start_soon(node_loop, store, nursery)
    for store in nodes:
        for job_id in (await reaper.reap(store.node, now=4.0)).interrupted:
            count_end(job_id)
    assert deaths == 3
    for i in range(total):
        job = await reaper.get(f"j{i}")
        assert job is not None
        runs = ran.get(job.id, [])
        assert len(runs) <= (2 if job.rerun_safe else 1), (seed, job.id, runs)
        if job.finished:
            assert ended.get(job.id) == 1, (seed, job.id, job.status)
        else:
            assert (job.status, ended.get(job.id)) == ("queued", None), (seed, job.id)
    assert sum(ended.values()) + (await reaper.counts())["queued"] == total
