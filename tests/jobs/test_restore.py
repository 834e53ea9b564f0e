"""A restart (after SIGKILL, at any moment) gives every accepted job its due:
queued ones back at their old place, running ones interrupted (or rerun once
if the client allowed it), and the one OOM requeue never granted twice."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.jobs.harness import EPOCH, proxy_request, running_jobs, settle
from yard.errors import Rejected
from yard.h1.upstream import UpstreamError
from yard.testing.engine import FakeEngine
from yard.testing.upstream import Answer, FakeUpstream


async def test_queued_jobs_come_back_in_order_with_their_arrival_and_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    db = tmp_path / "jobs.sqlite"
    async with running_jobs(db) as jobs:
        first = await jobs.submit(proxy_request(priority=10), rerun_safe=False)
        await trio.sleep(2)
        second = await jobs.submit(
            proxy_request(priority=90, start_by=trio.current_time() + 600), rerun_safe=False
        )
    await trio.sleep(100)  # yard is down for 100 s (t = 102 now)

    engine = FakeEngine(offset=5000.0)  # the new process's engine clock reads differently
    async with running_jobs(db, engine=engine) as jobs:
        submitted = [s.kwargs for s in engine.submitted]
        assert [s["request_id"] for s in submitted] == [first["id"], second["id"]]
        # Engine clock now = 5102; they arrived 102 s and 100 s ago.
        assert [s["arrived_at"] for s in submitted] == [5000.0, 5002.0]
        assert [s["priority"] for s in submitted] == [10, 90]
        assert submitted[0]["start_by"] is None
        assert submitted[1]["start_by"] == 5602.0
        assert all(not s["requeued"] for s in submitted)
        assert jobs.statistics().restored == 2
        shown = jobs.describe(await jobs.get(str(first["id"]), app="radio"))
        assert shown["status"] == "queued"
        assert shown["created_at"] == "2026-01-01T00:00:00.000Z"


async def test_a_job_running_when_yard_died_ends_interrupted_and_never_runs_again(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    db = tmp_path / "jobs.sqlite"
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(delay=1000))
    async with running_jobs(db, engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        engine.dispatch(job_id)
        await trio.sleep(10)
    assert len(upstream.calls) == 1

    for _ in range(2):
        engine = FakeEngine()
        async with running_jobs(db, engine=engine, upstream=upstream) as jobs:
            job = await jobs.get(job_id, app="radio")
            assert engine.submitted == []
            assert jobs.statistics().interrupted in (0, 1)
    assert job.status == "failed"
    assert job.error is not None and job.error.code == "interrupted"
    assert job.finished_at == EPOCH + 10.0
    assert len(upstream.calls) == 1


async def test_a_rerun_safe_job_goes_back_to_its_place_once_and_only_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    db = tmp_path / "jobs.sqlite"
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(delay=1000))
    async with running_jobs(db, engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=True))["id"])
        await trio.sleep(3)
        engine.dispatch(job_id)
        await trio.sleep(10)

    engine = FakeEngine()
    async with running_jobs(db, engine=engine, upstream=upstream) as jobs:
        assert [s.kwargs["request_id"] for s in engine.submitted] == [job_id]
        assert engine.submitted[0].kwargs["arrived_at"] == 0.0  # its old place
        job = await jobs.get(job_id, app="radio")
        assert (job.status, job.rerun_used) == ("queued", True)
        assert jobs.statistics().reruns == 1
        engine.dispatch(job_id)
        await trio.sleep(10)
    assert len(upstream.calls) == 2

    engine = FakeEngine()
    async with running_jobs(db, engine=engine, upstream=upstream) as jobs:
        job = await jobs.get(job_id, app="radio")
    assert engine.submitted == []
    assert job.status == "failed"
    assert job.error is not None and job.error.code == "interrupted"
    assert len(upstream.calls) == 2


async def test_a_job_requeued_after_an_oom_comes_back_queued_with_its_requeue_spent(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    db = tmp_path / "jobs.sqlite"
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(error=UpstreamError("gone", response_started=False)))
    async with running_jobs(db, engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        engine.dispatch(job_id)
        await settle()
        engine.requeue(job_id)
        await trio.sleep(1)

    engine = FakeEngine()
    async with running_jobs(db, engine=engine) as jobs:
        assert (await jobs.get(job_id, app="radio")).status == "queued"
    assert engine.submitted[0].kwargs["requeued"] is True


async def test_a_crash_before_the_oom_verdict_ends_the_job_interrupted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    db = tmp_path / "jobs.sqlite"
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(error=UpstreamError("gone", response_started=False)))
    async with running_jobs(db, engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=True))["id"])
        engine.dispatch(job_id)
        await trio.sleep(1)  # no verdict yet: it may have been the backend's own fault

    engine = FakeEngine()
    async with running_jobs(db, engine=engine) as jobs:
        job = await jobs.get(job_id, app="radio")
    # Rerun-safe, so it goes back once, but the OOM requeue counts as spent.
    assert (job.status, job.rerun_used, job.requeued) == ("queued", True, True)
    assert engine.submitted[0].kwargs["requeued"] is True


async def test_a_job_the_scheduler_refuses_on_restart_fails_with_its_code(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    db = tmp_path / "jobs.sqlite"
    async with running_jobs(db) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])

    engine = FakeEngine()
    engine.refuse = Rejected(status=404, code="model_not_found", message="tts is gone")
    async with running_jobs(db, engine=engine) as jobs:
        job = await jobs.get(job_id, app="radio")
    assert job.status == "failed"
    assert job.error is not None and job.error.code == "model_not_found"
