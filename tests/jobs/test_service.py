"""The job service on virtual time, with a fake engine and a fake upstream."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from tests.jobs.harness import EPOCH, proxy_request, running_jobs, settle
from yard.config import JobsConfig
from yard.errors import Rejected
from yard.h1.upstream import UpstreamError
from yard.jobs.service import JobFinished, JobNotFound
from yard.jobs.views import rfc3339
from yard.testing.engine import FakeEngine
from yard.testing.upstream import Answer, FakeUpstream


async def test_a_job_is_on_disk_before_it_enters_the_queue(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    db = tmp_path / "jobs.sqlite"
    engine = FakeEngine()
    seen_on_disk: list[tuple[object, ...]] = []

    def check_disk(request_id: str) -> None:
        # A separate connection sees only what was committed.
        conn = sqlite3.connect(db)
        try:
            row = conn.execute(
                "SELECT status, app FROM jobs WHERE id = ?", (request_id,)
            ).fetchone()
        finally:
            conn.close()
        seen_on_disk.append(row)

    engine.on_submit = check_disk
    async with running_jobs(db, engine=engine) as jobs:
        job = await jobs.submit(proxy_request(), rerun_safe=False)
    assert seen_on_disk == [("queued", "radio")]
    assert job["status"] == "queued"


async def test_submit_enqueues_with_priority_deadline_and_app_and_shows_the_queue(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine) as jobs:
        await trio.sleep(100)
        job = await jobs.submit(
            proxy_request(priority=70, start_by=160.0, allow_late=True), rerun_safe=True
        )
        assert engine.submitted[0].kwargs == {
            "backend": "tts",
            "priority": 70,
            "app": "radio",
            "request_id": job["id"],
            "start_by": 160.0,
            "allow_late": True,
            "arrived_at": None,
            "requeued": False,
            "not_before": None,
            "window_label": "",
        }
        await trio.sleep(5)
        shown = jobs.describe(await jobs.get(str(job["id"]), app="radio"))
    assert shown["status"] == "queued"
    assert shown["created_at"] == "2026-01-01T00:01:40.000Z"
    assert shown["deadline"] == "2026-01-01T00:02:40.000Z"
    assert shown["position"] == 0
    assert shown["reason"] == "waiting for tts to load"
    assert shown["effective_priority"] == 75.0  # 70, aged by the fake 1 point per second
    assert shown["estimated_start"] == rfc3339(EPOCH + 115.0)
    assert shown["rerun_safe"] is True
    assert shown["started_at"] is None and shown["error"] is None and shown["result"] is None


async def test_a_dispatched_job_runs_once_and_stores_the_answer(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(
        Answer(
            status=200,
            headers=[(b"content-type", b"audio/wav"), (b"x-voice", b"alto")],
            chunks=[b"RIFF", b"\x00\x01\x02"],
            delay=3.0,
        )
    )
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        await trio.sleep(10)
        engine.dispatch(job_id, "http://127.0.0.1:9999")
        await settle()
        assert (await jobs.get(job_id, app="radio")).status == "running"
        done = await jobs.wait_ended(job_id, app="radio")
        assert trio.current_time() == 13.0
        record, result = await jobs.result(job_id, app="radio")

    assert done.status == "succeeded"
    assert done.started_at == EPOCH + 10.0
    assert done.finished_at == EPOCH + 13.0
    assert done.queued_s == 10.0
    assert result is not None
    assert result.status == 200
    assert result.body == b"RIFF\x00\x01\x02"
    assert result.headers == ((b"content-type", b"audio/wav"), (b"x-voice", b"alto"))
    assert len(upstream.calls) == 1
    call = upstream.calls[0]
    assert call.base_url == "http://127.0.0.1:9999"
    assert call.request.body == proxy_request().body
    assert call.request.path == "/v1/audio/speech"
    assert (b"x-yard-request-id", job_id.encode()) in call.request.headers
    assert engine.admission(job_id).reports == [("ok", "")]
    assert jobs.describe(record)["result"] == {
        "status": 200,
        "content_type": "audio/wav",
        "bytes": 7,
        "url": f"/v1/jobs/{job_id}/result",
    }


async def test_a_backend_error_answer_fails_the_job_but_is_kept_as_its_result(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(status=500, chunks=[b'{"error": "boom"}']))
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        engine.dispatch(job_id)
        job = await jobs.wait_ended(job_id, app="radio")
        _, result = await jobs.result(job_id, app="radio")
    assert job.status == "failed"
    assert job.error is not None and job.error.code == "upstream_status"
    assert job.error.status == 500
    assert result is not None and result.body == b'{"error": "boom"}'
    assert engine.admission(job_id).reports == [("ok", "")]


async def test_a_rejection_by_the_scheduler_fails_the_job_with_its_code(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream()
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        await trio.sleep(30)
        engine.reject(job_id, "deadline_missed", 504, "the deadline passed while it waited")
        job = await jobs.wait_ended(job_id, app="radio")
    assert job.status == "failed"
    assert job.error is not None
    assert (job.error.code, job.error.status) == ("deadline_missed", 504)
    assert job.error.message == "the deadline passed while it waited"
    assert job.finished_at == EPOCH + 30.0
    assert upstream.calls == []


async def test_an_answer_above_the_result_limit_fails_with_result_too_large(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(chunks=[b"x" * 600, b"y" * 600]))
    config = JobsConfig(max_result_bytes=1000)
    async with running_jobs(
        tmp_path / "jobs.sqlite", engine=engine, upstream=upstream, config=config
    ) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        engine.dispatch(job_id)
        job = await jobs.wait_ended(job_id, app="radio")
        _, result = await jobs.result(job_id, app="radio")
    assert job.status == "failed"
    assert job.error is not None and job.error.code == "result_too_large"
    assert "1000 bytes" in job.error.message
    assert result is None
    assert engine.admission(job_id).reports[0][0] == "ok"


async def test_a_request_body_above_the_job_limit_is_refused_and_not_stored(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    config = JobsConfig(max_request_bytes=10)
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, config=config) as jobs:
        with pytest.raises(Rejected) as caught:
            await jobs.submit(proxy_request(body=b"x" * 11), rerun_safe=False)
        assert await jobs.list_jobs(app=None) == ([], False)
    assert (caught.value.status, caught.value.code) == (413, "job_too_large")
    assert engine.submitted == []


async def test_a_job_the_engine_refuses_at_once_is_not_kept(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    engine.refuse = Rejected(status=503, code="queue_full", message="full")
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine) as jobs:
        with pytest.raises(Rejected, match="full"):
            await jobs.submit(proxy_request(), rerun_safe=False)
        assert await jobs.list_jobs(app=None) == ([], False)


async def test_cancelling_a_queued_job_takes_it_out_of_the_queue(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream()
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        await trio.sleep(4)
        job = await jobs.cancel(job_id, app="radio")
        await settle()
        assert engine.snapshot().queue == ()
        with pytest.raises(JobFinished):
            await jobs.cancel(job_id, app="radio")
    assert job.status == "cancelled"
    assert job.finished_at == EPOCH + 4.0
    assert engine.admission(job_id).cancelled
    assert upstream.calls == []


async def test_cancelling_a_running_job_cancels_its_upstream_request(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(delay=1000.0))
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        engine.dispatch(job_id)
        await trio.sleep(7)
        assert (await jobs.get(job_id, app="radio")).status == "running"
        job = await jobs.cancel(job_id, app="radio")
        await settle()
        assert jobs.statistics().active == 0
    assert job.status == "cancelled"
    assert job.finished_at == EPOCH + 7.0
    assert upstream.calls[0].cancelled
    assert engine.admission(job_id).cancelled
    assert engine.admission(job_id).reports == []


async def test_another_apps_job_does_not_exist_for_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine) as jobs:
        job_id = str((await jobs.submit(proxy_request(app="radio"), rerun_safe=False))["id"])
        with pytest.raises(JobNotFound):
            await jobs.get(job_id, app="games")
        with pytest.raises(JobNotFound):
            await jobs.cancel(job_id, app="games")
        with pytest.raises(JobNotFound):
            await jobs.result(job_id, app="games")
        assert await jobs.list_jobs(app="games") == ([], False)
        assert (await jobs.get(job_id, app="radio")).status == "queued"
        assert (await jobs.get(job_id, app=None)).app == "radio"  # the admin sees all


async def test_listing_is_newest_first_filtered_and_paginated(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine) as jobs:
        ids = []
        for _ in range(5):
            ids.append(str((await jobs.submit(proxy_request(), rerun_safe=False))["id"]))
            await trio.sleep(1)
        await jobs.submit(proxy_request(app="games"), rerun_safe=False)
        await jobs.cancel(ids[1], app="radio")

        page, more = await jobs.list_jobs(app="radio", limit=2)
        assert [j.id for j in page] == [ids[4], ids[3]] and more
        page, more = await jobs.list_jobs(app="radio", limit=2, after=page[-1].id)
        assert [j.id for j in page] == [ids[2], ids[1]] and more
        page, more = await jobs.list_jobs(app="radio", limit=2, after=page[-1].id)
        assert [j.id for j in page] == [ids[0]] and not more
        page, _ = await jobs.list_jobs(app="radio", statuses=["cancelled"])
        assert [j.id for j in page] == [ids[1]]
        with pytest.raises(JobNotFound):
            await jobs.list_jobs(app="games", after=ids[0])


async def test_a_lost_connection_then_a_requeue_runs_it_again_and_spends_the_requeue(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(
        Answer(delay=2.0, error=UpstreamError("backend died", response_started=False)),
        Answer(delay=1.0, chunks=[b"second time"]),
    )
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        engine.dispatch(job_id)
        await trio.sleep(3)
        admission = engine.admission(job_id)
        assert admission.reports == [("upstream_lost", "backend died")]
        assert (await jobs.get(job_id, app="radio")).requeued  # on disk before the verdict
        engine.requeue(job_id)
        await trio.sleep(1)
        assert (await jobs.get(job_id, app="radio")).status == "queued"
        await trio.sleep(5)
        engine.dispatch(job_id)
        job = await jobs.wait_ended(job_id, app="radio")
        _, result = await jobs.result(job_id, app="radio")
        assert jobs.statistics().requeues == 1
    assert job.status == "succeeded" and job.requeued
    assert result is not None and result.body == b"second time"
    assert [call.at for call in upstream.calls] == [0.0, 9.0]
    assert admission.reports == [("upstream_lost", "backend died"), ("ok", "")]


async def test_a_lost_connection_the_core_blames_on_the_backend_fails_the_job(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(error=UpstreamError("reset", response_started=True)))
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        engine.dispatch(job_id)
        await settle()
        engine.reject(job_id, "backend_failed", 502, "tts crashed (exit code 3)")
        job = await jobs.wait_ended(job_id, app="radio")
    assert job.status == "failed"
    assert job.error is not None and job.error.code == "backend_failed"
    assert len(upstream.calls) == 1


async def test_shutting_down_leaves_queued_jobs_queued_for_the_next_start(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        engine.shut_down()
        await settle()
        assert (await jobs.get(job_id, app="radio")).status == "queued"
        assert jobs.statistics().active == 0


async def test_wait_ended_returns_when_the_job_ends_and_can_be_bounded(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(delay=20.0))
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, upstream=upstream) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        with trio.move_on_after(5):
            await jobs.wait_ended(job_id, app="radio")
        assert trio.current_time() == 5.0
        engine.dispatch(job_id)
        job = await jobs.wait_ended(job_id, app="radio")
        assert trio.current_time() == 25.0
        assert job.status == "succeeded"
        again = await jobs.wait_ended(job_id, app="radio")
        assert trio.current_time() == 25.0 and again == job


async def test_results_expire_after_their_ttl_and_records_are_forgotten_later(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    config = JobsConfig(result_ttl_s=100, record_ttl_s=1000, reap_interval_s=10)
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, config=config) as jobs:
        job_id = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        engine.dispatch(job_id)
        await jobs.wait_ended(job_id, app="radio")
        await trio.sleep(95)
        assert (await jobs.get(job_id, app="radio")).status == "succeeded"
        await trio.sleep(20)  # the reaper ran at 110
        job, result = await jobs.result(job_id, app="radio")
        assert job.status == "expired" and result is None
        shown = jobs.describe(job)
        assert (shown["status"], shown["result"]) == ("succeeded", None)
        assert shown["result_gone"] == (
            "its result was deleted 100 s after it ended ([jobs] result_ttl_s)"
        )
        await trio.sleep(1000)
        with pytest.raises(JobNotFound):
            await jobs.get(job_id, app="radio")
        assert jobs.statistics().expired == 1


async def test_submit_before_the_service_runs_is_refused_as_unavailable(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from yard.jobs.service import Jobs
    from yard.jobs.store import JobStore

    store = await JobStore.open(tmp_path / "jobs.sqlite", threaded=False)
    try:
        jobs = Jobs(engine=FakeEngine(), store=store, upstream=FakeUpstream())
        with pytest.raises(Rejected) as caught:
            await jobs.submit(proxy_request(), rerun_safe=False)
    finally:
        await store.close()
    assert (caught.value.status, caught.value.code) == (503, "jobs_unavailable")
