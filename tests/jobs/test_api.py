"""The jobs API over real HTTP: the gateway's app with the job service, a
real backend on loopback, the fake engine dispatching at once."""

from __future__ import annotations

import gc
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from yard.app.web import Parts, create_app, serve_app
from yard.config import AppConfig, BackendConfig, Config, ServerConfig, load_config
from yard.core.spec import SchedulerConfig
from yard.engine import Engine
from yard.jobs import JobsConfig, open_jobs
from yard.jobs.service import Jobs
from yard.testing.engine import FakeEngine
from yard.testing.fake import FakeBackend as Backend
from yard.testing.fake import serve_fake as serve_backend
from yard.testing.payloads import audio_bytes

RADIO = {"authorization": "Bearer key-radio"}
GAMES = {"authorization": "Bearer key-games"}
ADMIN = {"authorization": "Bearer key-admin"}
ASYNC = {"prefer": "respond-async"}


def make_config(data_dir: Path) -> Config:
    return Config(
        path=data_dir / "yard.toml",
        server=ServerConfig(data_dir=data_dir, admin_key="key-admin", max_body_bytes=1 << 20),
        scheduler=SchedulerConfig(),
        devices={},
        apps={
            name: AppConfig(name=name, key=f"key-{name}", default_priority=50, max_priority=100)
            for name in ("radio", "games")
        },
        backends={"tts": BackendConfig(name="tts", models=("voice",), command=("true",))},
    )


@dataclass
class Yard:
    client: httpx.AsyncClient
    backend: Backend
    engine: FakeEngine
    jobs: Jobs


@asynccontextmanager
async def running_api(tmp_path: Path, jobs_toml: str = "") -> AsyncIterator[Yard]:
    """The gateway's app with the job service, configured by a ``[jobs]``
    table (``jobs_toml``, read by the real configuration loader)."""
    config_file = tmp_path / "yard.toml"
    config_file.write_text(f'[server]\ndata_dir = "{tmp_path}"\n\n[jobs]\n{jobs_toml}')
    settings = load_config(config_file).jobs
    async with trio.open_nursery() as nursery:
        backend = await nursery.start(serve_backend, Backend())
        engine = FakeEngine({"tts": backend.base_url}, auto_dispatch=True)
        async with open_jobs(engine=engine, data_dir=tmp_path, config=settings) as jobs:
            await nursery.start(jobs.run)
            parts = Parts(config=make_config(tmp_path), engine=cast(Engine, engine), jobs=jobs)
            binds = await nursery.start(serve_app, create_app(parts), "127.0.0.1", 0)
            async with httpx.AsyncClient(base_url=binds[0], timeout=20.0) as client:
                yield Yard(client=client, backend=backend, engine=engine, jobs=jobs)
            nursery.cancel_scope.cancel()


@pytest.fixture
async def yard(tmp_path: Path) -> AsyncIterator[Yard]:
    async with running_api(tmp_path) as running:
        yield running


async def submit(yard: Yard, path: str, body: object, headers: dict[str, str]) -> str:
    response = await yard.client.post(path, json=body, headers={**ASYNC, **headers})
    assert response.status_code == 202, response.text
    job_id = str(response.json()["id"])
    assert response.headers["location"] == f"/v1/jobs/{job_id}"
    return job_id


@pytest.mark.slow
async def test_several_megabytes_of_audio_come_back_byte_for_byte(yard: Yard) -> None:
    size = 6 * 2**20 + 12345
    with trio.fail_after(30):
        job_id = await submit(yard, "/v1/audio/speech", {"model": "voice", "bytes": size}, RADIO)
        job = (await yard.client.get(f"/v1/jobs/{job_id}?wait=20", headers=RADIO)).json()
        result = await yard.client.get(f"/v1/jobs/{job_id}/result", headers=RADIO)
    assert job["status"] == "succeeded", job
    assert job["result"]["bytes"] == size
    assert result.status_code == 200
    assert result.headers["content-type"] == "audio/wav"
    assert result.headers["x-voice"] == "alto"
    assert result.headers["x-yard-job-id"] == job_id
    assert len(result.content) == size
    assert result.content == audio_bytes(size)
    assert yard.backend.seen == [("/v1/audio/speech", job_id)]


@pytest.mark.slow
async def test_a_result_keeps_the_backends_status_and_lack_of_content_type(yard: Yard) -> None:
    with trio.fail_after(30):
        job_id = await submit(yard, "/backends/tts/bare", {"x": 1}, RADIO)
        job = (await yard.client.get(f"/v1/jobs/{job_id}?wait=20", headers=RADIO)).json()
        result = await yard.client.get(f"/v1/jobs/{job_id}/result", headers=RADIO)
    assert job["status"] == "succeeded"
    assert job["result"]["content_type"] is None
    assert (result.status_code, result.content) == (201, b"\x00raw")
    assert "content-type" not in result.headers
    assert result.headers["content-length"] == "4"


@pytest.mark.slow
async def test_another_apps_key_cannot_see_fetch_or_cancel_a_job(yard: Yard) -> None:
    with trio.fail_after(30):
        job_id = await submit(yard, "/backends/tts/slow", {"x": 1}, RADIO)
        await yard.backend.slow_started.wait()
        answers = [
            await yard.client.get(f"/v1/jobs/{job_id}", headers=GAMES),
            await yard.client.get(f"/v1/jobs/{job_id}/result", headers=GAMES),
            await yard.client.delete(f"/v1/jobs/{job_id}", headers=GAMES),
        ]
        listing = (await yard.client.get("/v1/jobs", headers=GAMES)).json()
        # A cursor naming another app's job is refused as one naming no job.
        cursors = [
            await yard.client.get(f"/v1/jobs?after={after}", headers=GAMES)
            for after in (job_id, "job_nope")
        ]
        no_key = await yard.client.get(f"/v1/jobs/{job_id}")
        wrong_key = await yard.client.get(f"/v1/jobs/{job_id}", headers={"authorization": "x"})
        mine = (await yard.client.get(f"/v1/jobs/{job_id}", headers=RADIO)).json()
        admin = (await yard.client.get("/v1/jobs", headers=ADMIN)).json()
    assert [a.status_code for a in answers] == [404, 404, 404]
    assert all(a.json()["error"]["code"] == "job_not_found" for a in answers)
    assert listing["data"] == []
    assert [(c.status_code, c.json()["error"]["code"]) for c in cursors] == [
        (400, "invalid_cursor")
    ] * 2
    assert cursors[0].json()["error"]["message"] == cursors[1].json()["error"]["message"].replace(
        "job_nope", job_id
    )
    assert (no_key.status_code, wrong_key.status_code) == (401, 401)
    assert mine["status"] == "running"  # the other app's DELETE did nothing
    assert yard.backend.hung_up == 0
    assert [j["id"] for j in admin["data"]] == [job_id]


@pytest.mark.slow
async def test_delete_of_a_running_job_cancels_its_upstream_request(yard: Yard) -> None:
    with trio.fail_after(30):
        job_id = await submit(yard, "/backends/tts/slow", {"x": 1}, RADIO)
        await yard.backend.slow_started.wait()
        deleted = await yard.client.delete(f"/v1/jobs/{job_id}", headers=RADIO)
        await yard.backend.hung_up_event.wait()
        again = await yard.client.delete(f"/v1/jobs/{job_id}", headers=RADIO)
        result = await yard.client.get(f"/v1/jobs/{job_id}/result", headers=RADIO)
    assert deleted.status_code == 200
    assert deleted.json()["status"] == "cancelled"
    assert (again.status_code, again.json()["error"]["code"]) == (409, "job_finished")
    assert (result.status_code, result.json()["error"]["code"]) == (409, "cancelled")


@pytest.mark.slow
async def test_a_backend_error_is_the_result_and_a_queued_job_has_none_yet(
    yard: Yard,
) -> None:
    with trio.fail_after(30):
        failed_id = await submit(yard, "/backends/tts/fail", {"x": 1}, RADIO)
        job = (await yard.client.get(f"/v1/jobs/{failed_id}?wait=20", headers=RADIO)).json()
        result = await yard.client.get(f"/v1/jobs/{failed_id}/result", headers=RADIO)
        yard.engine.auto_dispatch = False
        queued_id = await submit(yard, "/v1/audio/speech", {"model": "voice", "bytes": 1}, RADIO)
        early = await yard.client.get(f"/v1/jobs/{queued_id}/result?wait=0.2", headers=RADIO)
        shown = (await yard.client.get(f"/v1/jobs/{queued_id}", headers=RADIO)).json()
    assert job["status"] == "failed"
    assert job["error"]["code"] == "upstream_status"
    assert (result.status_code, result.content) == (500, b'{"error": "boom"}')
    assert (early.status_code, early.json()["error"]["code"]) == (409, "job_not_finished")
    assert shown["status"] == "queued"
    assert shown["position"] == 0
    assert shown["reason"] == "waiting for tts to load"


@pytest.mark.slow
async def test_listing_filters_by_status_and_pages_with_a_cursor(yard: Yard) -> None:
    with trio.fail_after(30):
        yard.engine.auto_dispatch = False
        ids = [
            await submit(yard, "/v1/audio/speech", {"model": "voice", "bytes": 1}, RADIO)
            for _ in range(3)
        ]
        deleted = await yard.client.delete(f"/v1/jobs/{ids[0]}", headers=RADIO)
        first = (await yard.client.get("/v1/jobs?limit=2", headers=RADIO)).json()
        second = (
            await yard.client.get(f"/v1/jobs?limit=2&after={first['last_id']}", headers=RADIO)
        ).json()
        queued = (await yard.client.get("/v1/jobs?status=queued", headers=RADIO)).json()
        bad = await yard.client.get("/v1/jobs?status=sleeping", headers=RADIO)
    assert (deleted.status_code, deleted.json()["status"]) == (200, "cancelled")
    # A queued job that is deleted leaves the scheduler's queue at once.
    assert yard.engine.admission(ids[0]).cancelled
    assert [q.request_id for q in yard.engine.snapshot().queue] == ids[1:]
    assert [j["id"] for j in first["data"]] == [ids[2], ids[1]] and first["has_more"]
    assert [j["id"] for j in second["data"]] == [ids[0]] and not second["has_more"]
    assert [j["id"] for j in queued["data"]] == [ids[2], ids[1]]
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_status")


@pytest.mark.slow
async def test_a_job_is_json_with_rfc3339_times_and_its_request_went_through_unchanged(
    yard: Yard,
) -> None:
    body = {"model": "voice", "bytes": 10, "input": "caf\u00e9"}
    with trio.fail_after(30):
        job_id = await submit(yard, "/v1/audio/speech", body, {**RADIO, "x-yard-priority": "70"})
        job = (await yard.client.get(f"/v1/jobs/{job_id}?wait=20", headers=RADIO)).json()
    assert job["priority"] == 70
    assert job["model"] == "voice" and job["app"] == "radio"
    assert job["created_at"].endswith("Z") and "T" in job["created_at"]
    assert job["finished_at"] >= job["started_at"] >= job["created_at"]
    assert json.loads(json.dumps(job)) == job


async def test_the_connections_a_job_used_close_when_the_service_does(tmp_path: Path) -> None:
    # open_jobs without a pool used the process-wide one: its kept-alive
    # connection to the backend stayed open after the service had stopped, until
    # the interpreter's exit (ResourceWarning: unclosed socket).
    with trio.fail_after(30):
        async with running_api(tmp_path) as running:
            body = {"model": "voice", "bytes": 10}
            job_id = await submit(running, "/v1/audio/speech", body, RADIO)
            job = (await running.client.get(f"/v1/jobs/{job_id}?wait=20", headers=RADIO)).json()
            assert job["status"] == "succeeded"
            port = urlsplit(running.backend.base_url).port
    gc.collect()
    to_backend = [
        s
        for s in gc.get_objects()
        if isinstance(s, socket.socket) and s.fileno() != -1 and _peer_port(s) == port
    ]
    assert to_backend == []


def _peer_port(s: socket.socket) -> int | None:
    if s.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        return int(s.getpeername()[1])
    except OSError:  # not connected
        return None


@pytest.mark.slow
async def test_yard_jobs_cli_lists_shows_fetches_and_cancels(
    yard: Yard, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from yard.cli import main

    url = str(yard.client.base_url).rstrip("/")

    async def cli(*argv: str) -> int:
        args = ["jobs", "--url", url, "--key", "key-radio", *argv]
        return await trio.to_thread.run_sync(main, args)

    with trio.fail_after(60):
        done_id = await submit(yard, "/v1/audio/speech", {"model": "voice", "bytes": 5000}, RADIO)
        assert await cli("show", done_id, "--wait", "20") == 0
        shown = capsys.readouterr().out
        out_file = tmp_path / "speech.wav"
        assert await cli("result", done_id, "--output", str(out_file)) == 0
        capsys.readouterr()
        yard.engine.auto_dispatch = False
        queued_id = await submit(yard, "/v1/audio/speech", {"model": "voice", "bytes": 1}, RADIO)
        assert await cli("list") == 0
        listing = capsys.readouterr().out
        assert await cli("cancel", queued_id) == 0
        cancelled = capsys.readouterr().out
        assert await cli("show", "job_nope") == 1
        missing = capsys.readouterr().err
    assert f"{done_id}  succeeded  (radio -> voice)" in shown
    assert "result: HTTP 200, 5000 bytes, audio/wav" in shown
    assert out_file.read_bytes() == audio_bytes(5000)
    lines = listing.splitlines()
    assert lines[0].split() == ["ID", "APP", "MODEL", "STATUS", "CREATED", "POSITION", "/", "ERROR"]
    assert lines[1].split()[:4] == [queued_id, "radio", "voice", "queued"]
    assert lines[2].split()[:4] == [done_id, "radio", "voice", "succeeded"]
    assert cancelled.strip() == f"{queued_id}: cancelled"
    assert "HTTP 404: job_not_found" in missing


def _epoch(rfc3339: object) -> float:
    assert isinstance(rfc3339, str) and rfc3339.endswith("Z"), rfc3339
    return datetime.fromisoformat(rfc3339).timestamp()


@pytest.mark.slow
async def test_a_queued_job_shows_its_place_reason_and_estimated_start_and_wait_long_polls(
    yard: Yard,
) -> None:
    with trio.fail_after(30):
        yard.engine.auto_dispatch = False
        ahead = await submit(yard, "/v1/audio/speech", {"model": "voice", "bytes": 1}, RADIO)
        job_id = await submit(yard, "/v1/audio/speech", {"model": "voice", "bytes": 3}, RADIO)
        asked_at = time.time()
        shown = (await yard.client.get(f"/v1/jobs/{job_id}", headers=RADIO)).json()
        answered_at = time.time()
        began = trio.current_time()
        still = (await yard.client.get(f"/v1/jobs/{job_id}?wait=0.3", headers=RADIO)).json()
        short_wait_s = trio.current_time() - began
        async with trio.open_nursery() as nursery:

            async def long_poll() -> None:
                response = await yard.client.get(f"/v1/jobs/{job_id}?wait=20", headers=RADIO)
                polled.append(response.json())

            polled: list[dict[str, object]] = []
            nursery.start_soon(long_poll)
            # The long poll is in once its wait is registered with the service
            # (nothing public says so; the poll only orders the test's steps).
            while job_id not in yard.jobs._ended:  # noqa: ASYNC110
                await trio.sleep(0.01)
            assert polled == []
            yard.engine.dispatch(ahead, yard.backend.base_url)
            yard.engine.dispatch(job_id, yard.backend.base_url)
    # Place in the queue (0 = next), why it waits, and when it should start:
    # the fake engine estimates 10 s from now, shown on the wall clock.
    assert (shown["status"], shown["position"]) == ("queued", 1)
    assert shown["reason"] == "waiting for tts to load"
    assert asked_at + 10.0 - 0.01 <= _epoch(shown["estimated_start"]) <= answered_at + 10.0 + 0.01
    # ?wait= on a job that does not end returns it, still queued, after the wait.
    assert still["status"] == "queued" and short_wait_s >= 0.3
    # ?wait= returns as soon as the job ends, with the ended job.
    assert [job["status"] for job in polled] == ["succeeded"]
    assert polled[0]["result"] == {
        "status": 200,
        "content_type": "audio/wav",
        "bytes": 3,
        "url": f"/v1/jobs/{job_id}/result",
    }


@pytest.mark.slow
async def test_wait_is_capped_by_the_jobs_table_and_nonsense_is_refused(tmp_path: Path) -> None:
    async with running_api(tmp_path, "max_wait_s = 0.2\nresult_ttl_s = 90\n") as yard:
        assert yard.jobs.config == JobsConfig(max_wait_s=0.2, result_ttl_s=90.0)
        with trio.fail_after(30):
            yard.engine.auto_dispatch = False
            job_id = await submit(yard, "/v1/audio/speech", {"model": "voice", "bytes": 1}, RADIO)
            began = trio.current_time()
            capped = await yard.client.get(f"/v1/jobs/{job_id}?wait=600", headers=RADIO)
            capped_s = trio.current_time() - began
            bad = [
                await yard.client.get(f"/v1/jobs/{job_id}?wait={text}", headers=RADIO)
                for text in ("soon", "-1", "nan", "inf")
            ]
    assert capped.json()["status"] == "queued"
    # Cut to max_wait_s (well below the 30 s bound that would fail the test).
    assert 0.2 <= capped_s < 20
    assert [(b.status_code, b.json()["error"]["code"]) for b in bad] == [(400, "invalid_wait")] * 4


async def test_wrong_keys_on_every_route_share_the_admin_apis_throttle(yard: Yard) -> None:
    # Issue 24, case 9: /v1/jobs, /v1/batches and /v1/announcements compared
    # the admin key themselves, outside the throttle (1,325 guesses a second,
    # never a 429). Now every guess counts, on whichever route it is made.
    wrong = {"authorization": "Bearer not-the-admin-key"}
    routes = ["/v1/jobs", "/v1/batches", "/v1/announcements", "/v1/jobs", "/v1/files"]
    answers = [(await yard.client.get(route, headers=wrong)).status_code for route in routes]
    assert all(status in (401, 403) for status in answers), answers
    # The sixth wrong key makes the address wait; it is told how long.
    sixth = await yard.client.get("/v1/jobs", headers=wrong)
    assert sixth.status_code in (401, 403) and int(sixth.headers["retry-after"]) >= 1
    for route in ("/v1/jobs", "/v1/batches", "/v1/announcements", "/admin/status"):
        waiting = await yard.client.get(route, headers=ADMIN)
        assert waiting.status_code == 429, (route, waiting.text)
        assert waiting.headers["retry-after"] == "1"
    # An app's right key does not clear the record either.
    assert (await yard.client.get("/v1/jobs", headers=RADIO)).status_code == 429
