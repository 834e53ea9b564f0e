"""The per-app job quota: how many jobs, and how many stored bytes, an app may
keep (queued, running, or finished with a result not yet expired)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.jobs.harness import proxy_request, running_jobs
from tests.jobs.test_api import ASYNC, RADIO, running_api, submit
from yard.config import ConfigError, JobsConfig, load_config
from yard.errors import Rejected
from yard.jobs.service import JobNotFinished
from yard.testing.engine import FakeEngine
from yard.testing.upstream import Answer, FakeUpstream


async def test_an_app_at_its_job_count_is_refused_with_429_until_a_result_is_deleted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    config = JobsConfig(max_jobs_per_app=2, result_ttl_s=100, reap_interval_s=10)
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, config=config) as jobs:
        done = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        engine.dispatch(done)
        await jobs.wait_ended(done, app="radio")
        queued = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        await trio.sleep(30)
        # A finished job with its result counts as much as a queued one.
        with pytest.raises(Rejected) as full:
            await jobs.submit(proxy_request(), rerun_safe=False)
        # Another app has its own quota.
        await jobs.submit(proxy_request(app="games"), rerun_safe=False)
        with pytest.raises(JobNotFinished):
            await jobs.delete_result(queued, app="radio")
        freed = await jobs.delete_result(done, app="radio")
        third = await jobs.submit(proxy_request(), rerun_safe=False)
        stored = await jobs.list_jobs(app="radio")
    assert (full.value.status, full.value.code) == (429, "too_many_jobs")
    message = full.value.message
    assert "max_jobs_per_app" in message and "2" in message
    assert "DELETE /v1/jobs/ID/result" in message and "result_ttl_s" in message
    # The finished job's result expires 100 s after it ended, 30 s ago.
    assert full.value.retry_after_s == pytest.approx(70.0)
    assert freed.status == "expired"
    assert third["status"] == "queued"
    assert [j.status for j in stored[0]] == ["queued", "queued", "expired"]
    assert len(engine.submitted) == 4


async def test_an_expired_or_cancelled_job_frees_its_place(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    config = JobsConfig(max_jobs_per_app=1, result_ttl_s=100, reap_interval_s=10)
    async with running_jobs(tmp_path / "jobs.sqlite", engine=engine, config=config) as jobs:
        first = str((await jobs.submit(proxy_request(), rerun_safe=False))["id"])
        await jobs.cancel(first, app="radio")
        # Cancelled: ended with no result, but listed until it expires.
        with pytest.raises(Rejected):
            await jobs.submit(proxy_request(), rerun_safe=False)
        await trio.sleep(111)  # the reaper expired it
        second = await jobs.submit(proxy_request(), rerun_safe=False)
    assert second["status"] == "queued"


async def test_stored_bytes_past_the_app_quota_are_refused_with_507(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    engine = FakeEngine()
    upstream = FakeUpstream(Answer(chunks=[b"r" * 600]))
    config = JobsConfig(max_stored_bytes_per_app=1000)
    async with running_jobs(
        tmp_path / "jobs.sqlite", engine=engine, upstream=upstream, config=config
    ) as jobs:
        done = str((await jobs.submit(proxy_request(body=b"q" * 300), rerun_safe=False))["id"])
        engine.dispatch(done)
        await jobs.wait_ended(done, app="radio")
        # 600 result bytes + 300 queued request bytes = 900.
        await jobs.submit(proxy_request(body=b"q" * 300), rerun_safe=False)
        with pytest.raises(Rejected) as full:
            await jobs.submit(proxy_request(body=b"q" * 101), rerun_safe=False)
        fits = await jobs.submit(proxy_request(body=b"q" * 100), rerun_safe=False)
    assert (full.value.status, full.value.code) == (507, "job_storage_full")
    message = full.value.message
    assert "max_stored_bytes_per_app" in message and "1000" in message and "900" in message
    assert "DELETE /v1/jobs/ID/result" in message
    assert full.value.retry_after_s == pytest.approx(24 * 3600.0)
    assert fits["status"] == "queued"


@pytest.mark.slow
async def test_the_quota_over_http_refuses_with_a_clear_error_and_delete_result_frees_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from yard.cli import main

    async with running_api(tmp_path, "max_jobs_per_app = 1\n") as yard:
        with trio.fail_after(30):
            body = {"model": "voice", "bytes": 10}
            job_id = await submit(yard, "/v1/audio/speech", body, RADIO)
            await yard.client.get(f"/v1/jobs/{job_id}?wait=20", headers=RADIO)
            refused = await yard.client.post(
                "/v1/audio/speech", json=body, headers={**ASYNC, **RADIO}
            )
            deleted = await yard.client.delete(f"/v1/jobs/{job_id}/result", headers=RADIO)
            gone = await yard.client.get(f"/v1/jobs/{job_id}/result", headers=RADIO)
            again = await yard.client.post(
                "/v1/audio/speech", json=body, headers={**ASYNC, **RADIO}
            )
            again_id = again.json()["id"]
            await yard.client.get(f"/v1/jobs/{again_id}?wait=20", headers=RADIO)
            url = str(yard.client.base_url).rstrip("/")
            argv = ["jobs", "--url", url, "--key", "key-radio", "delete-result", again_id]
            code = await trio.to_thread.run_sync(main, argv)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "too_many_jobs"
    assert int(refused.headers["retry-after"]) > 0
    # The job succeeded; its result is gone, on request (not "expired", not "long ago").
    assert (deleted.status_code, deleted.json()["status"]) == (200, "succeeded")
    assert deleted.json()["result_gone"] == (
        "its result was deleted on request (DELETE /v1/jobs/ID/result)"
    )
    assert (gone.status_code, gone.json()["error"]["code"]) == (410, "job_expired")
    assert gone.json()["error"]["message"] == (
        f"job {job_id} succeeded; its result was deleted on request (DELETE /v1/jobs/ID/result)"
    )
    assert again.status_code == 202
    assert code == 0
    assert capsys.readouterr().out.strip() == f"{again_id}: result deleted (the job succeeded)"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("max_jobs_per_app = 0", "jobs.max_jobs_per_app: must be greater than 0"),
        ("max_jobs_per_app = 2.5", "jobs.max_jobs_per_app: must be"),
        ('max_stored_bytes_per_app = "0B"', "jobs.max_stored_bytes_per_app: must be greater"),
        ('max_stored_bytes_per_app = "lots"', "jobs.max_stored_bytes_per_app:"),
    ],
)
def test_the_quota_keys_are_checked_and_named(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "yard.toml"
    path.write_text(f"[jobs]\n{line}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert any(problem in error for error in info.value.errors), info.value.errors


def test_the_quota_keys_have_sane_defaults_and_take_sizes(tmp_path: Path) -> None:
    path = tmp_path / "yard.toml"
    path.write_text('[jobs]\nmax_jobs_per_app = 20\nmax_stored_bytes_per_app = "64MiB"\n')
    jobs = load_config(path).jobs
    assert (jobs.max_jobs_per_app, jobs.max_stored_bytes_per_app) == (20, 64 * 2**20)
    assert (JobsConfig().max_jobs_per_app, JobsConfig().max_stored_bytes_per_app) == (1000, 2**31)
