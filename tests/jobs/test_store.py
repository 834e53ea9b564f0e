"""The job store: a job ends once, bytes go with their job, old ones expire."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from yard.jobs.store import JobError, JobStore, StoredRequest, StoredResult

REQUEST = StoredRequest(
    method="POST",
    path="/v1/audio/speech",
    query="format=wav",
    headers=((b"content-type", b"application/json"), (b"x-odd", b"caf\xe9")),
    body=b'{"input": "hi"}',
)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[JobStore]:
    store = await JobStore.open(tmp_path / "jobs.sqlite")
    try:
        yield store
    finally:
        await store.close()


async def add(store: JobStore, job_id: str, *, at: float = 100.0) -> None:
    await store.insert(
        job_id=job_id,
        app="radio",
        model="voice",
        backend="tts",
        priority=50.0,
        start_by=None,
        allow_late=False,
        rerun_safe=False,
        created_at=at,
        request=REQUEST,
    )


async def test_the_request_comes_back_exactly_as_stored(store: JobStore) -> None:
    await add(store, "a")
    assert await store.request("a") == REQUEST


async def test_a_job_ends_once_and_the_first_end_wins(store: JobStore) -> None:
    await add(store, "a")
    cancelled = JobError(code="cancelled", message="bye", status=499)
    result = StoredResult(status=200, headers=(), body=b"late")
    assert await store.finish("a", "cancelled", at=110.0, error=cancelled)
    assert not await store.finish("a", "succeeded", at=111.0, result=result)
    assert not await store.mark_running("a", at=112.0, queued_s=1.0)
    job = await store.get("a")
    assert job is not None
    assert (job.status, job.finished_at, job.error) == ("cancelled", 110.0, cancelled)
    assert await store.result("a") is None
    assert await store.request("a") is None  # it will never run: bytes dropped


async def test_finish_refuses_a_status_that_is_not_final(store: JobStore) -> None:
    await add(store, "a")
    with pytest.raises(ValueError, match="final status"):
        await store.finish("a", "running", at=1.0)


async def test_expiry_deletes_results_of_old_finished_jobs_only(store: JobStore) -> None:
    for job_id, at in (("old", 100.0), ("new", 200.0), ("waiting", 50.0)):
        await add(store, job_id, at=at)
    body = StoredResult(status=200, headers=((b"content-type", b"audio/wav"),), body=b"RIFF")
    await store.finish("old", "succeeded", at=150.0, result=body)
    await store.finish("new", "succeeded", at=250.0, result=body)
    assert await store.expire(finished_before=200.0) == ["old"]
    assert await store.result("old") is None
    assert await store.result("new") == body
    assert await store.counts() == {
        "queued": 1,
        "running": 0,
        "succeeded": 1,
        "failed": 0,
        "cancelled": 0,
        "expired": 1,
    }
    assert await store.purge(finished_before=151.0) == 1
    assert await store.get("old") is None
    assert await store.get("waiting") is not None


async def test_unfinished_jobs_come_back_in_arrival_order(store: JobStore) -> None:
    for job_id in ("c", "a", "b"):
        await add(store, job_id)
    await store.mark_running("a", at=101.0, queued_s=1.0)
    assert [job.id for job in await store.unfinished()] == ["c", "a", "b"]
    assert [job.status for job in await store.unfinished()] == ["queued", "running", "queued"]
