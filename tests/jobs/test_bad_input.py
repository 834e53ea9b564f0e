"""The jobs API under bad input: out-of-range deadlines, stored records with
unreadable fields, nonsense query parameters, and the per-app storage quota.
Each case answers a clear 4xx (never a 500), and the API keeps working."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from tests.jobs.test_api import ASYNC, RADIO, Yard, running_api, submit

SPEECH = {"model": "voice", "bytes": 1}


@pytest.mark.slow
@pytest.mark.parametrize(
    "header",
    [
        ("x-yard-start-within", "1e20"),
        ("x-yard-start-within", "1e300"),
        ("x-yard-start-by", "9999-12-31T23:59:59-23:59"),
        ("x-yard-start-by", "0001-01-01T00:00:00+23:59"),
    ],
)
async def test_an_out_of_range_deadline_is_refused_before_anything_is_stored(
    tmp_path: Path, header: tuple[str, str]
) -> None:
    async with running_api(tmp_path) as yard:
        with trio.fail_after(30):
            refused = await yard.client.post(
                "/v1/audio/speech", json=SPEECH, headers={**ASYNC, **RADIO, header[0]: header[1]}
            )
            listing = await yard.client.get("/v1/jobs", headers=RADIO)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "invalid_deadline"
    assert header[0] in refused.json()["error"]["message"].lower()
    assert listing.status_code == 200
    assert listing.json()["data"] == []
    assert yard.engine.submitted == []


def _poison(db: Path, job_id: str, **columns: object) -> None:
    conn = sqlite3.connect(db)
    try:
        for column, value in columns.items():
            conn.execute(f"UPDATE jobs SET {column} = ? WHERE id = ?", (value, job_id))
        conn.commit()
    finally:
        conn.close()


@pytest.mark.slow
async def test_a_stored_job_with_unreadable_fields_is_still_listed_with_nulls_and_notes(
    tmp_path: Path,
) -> None:
    async with running_api(tmp_path) as yard:
        with trio.fail_after(30):
            yard.engine.auto_dispatch = False
            bad = await submit(yard, "/v1/audio/speech", SPEECH, RADIO)
            good = await submit(yard, "/v1/audio/speech", SPEECH, RADIO)
            # What an older yard (or a damaged disk) may have left behind.
            _poison(
                tmp_path / "jobs.sqlite",
                bad,
                start_by=1e20,
                created_at=2.6e11,
                queued_s="soon",
                error_code="x",
                error_status="five hundred",
            )
            listing = await yard.client.get("/v1/jobs", headers=RADIO)
            one = await yard.client.get(f"/v1/jobs/{bad}", headers=RADIO)
            admin = await yard.client.get("/v1/jobs", headers={"authorization": "Bearer key-admin"})
    assert listing.status_code == 200, listing.text
    assert [j["id"] for j in listing.json()["data"]] == [good, bad]
    assert one.status_code == 200, one.text
    job = one.json()
    assert job["deadline"] is None and job["created_at"] is None
    assert job["queued_ms"] is None
    assert job["error"]["status"] is None
    notes = " | ".join(job["notes"])
    for field in ("deadline", "created_at", "queued_s", "error_status"):
        assert field in notes, notes
    assert listing.json()["data"][0]["notes"] == []
    assert admin.status_code == 200


@pytest.mark.slow
async def test_a_stored_bad_deadline_survives_a_restart(tmp_path: Path) -> None:
    async with running_api(tmp_path) as yard:
        with trio.fail_after(30):
            yard.engine.auto_dispatch = False
            job_id = await submit(yard, "/v1/audio/speech", SPEECH, RADIO)
    _poison(tmp_path / "jobs.sqlite", job_id, start_by=1e20)
    async with running_api(tmp_path) as yard:
        with trio.fail_after(30):
            listing = await yard.client.get("/v1/jobs", headers=RADIO)
            one = await yard.client.get(f"/v1/jobs/{job_id}", headers=RADIO)
    assert (listing.status_code, one.status_code) == (200, 200)
    assert one.json()["deadline"] is None
    assert "deadline" in one.json()["notes"][0]
    # Restored into the queue (and run: the fake engine dispatches at once).
    assert [s.kwargs["request_id"] for s in yard.engine.submitted] == [job_id]


@pytest.mark.slow
async def test_every_query_parameter_of_the_jobs_api_refuses_nonsense_with_400(
    tmp_path: Path,
) -> None:
    huge = "9" * 5000
    async with running_api(tmp_path) as yard:
        await _query_cases(yard, huge)


async def _query_cases(yard: Yard, huge: str) -> None:
    with trio.fail_after(30):
        # A finished job: a wait on it returns at once, however long.
        job_id = await submit(yard, "/v1/audio/speech", SPEECH, RADIO)
        await yard.client.get(f"/v1/jobs/{job_id}?wait=20", headers=RADIO)
        cases = {
            f"/v1/jobs?limit={huge}": "invalid_limit",
            "/v1/jobs?limit=%C2%B2": "invalid_limit",  # a superscript two: isdigit() says yes
            "/v1/jobs?limit=%D9%A1": "invalid_limit",  # an Arabic-Indic one
            "/v1/jobs?limit=0": "invalid_limit",
            "/v1/jobs?limit=-1": "invalid_limit",
            "/v1/jobs?limit=1e1": "invalid_limit",
            f"/v1/jobs?status={huge}": "invalid_status",
            "/v1/jobs?after=%ED%A0%80": "invalid_cursor",
            f"/v1/jobs?after={huge}": "invalid_cursor",
            f"/v1/jobs/{job_id}?wait={huge}": "invalid_wait",  # no float is that large
            f"/v1/jobs/{job_id}?wait=300": None,  # capped to max_wait_s; the job has ended
            f"/v1/jobs/{job_id}?wait=1e999": "invalid_wait",
            f"/v1/jobs/{job_id}?wait=%00": "invalid_wait",
            f"/v1/jobs/{job_id}/result?wait=nan": "invalid_wait",
        }
        answers = {}
        for url in cases:
            answers[url] = await yard.client.get(url, headers=RADIO)
        odd_ids = [
            await yard.client.get(f"/v1/jobs/{name}", headers=RADIO)
            for name in ("%ED%A0%80", "%00", "x" * 3000)
        ]
    for url, code in cases.items():
        answer = answers[url]
        if code is None:
            assert answer.status_code == 200, (url[:60], answer.text[:200])
            continue
        assert answer.status_code == 400, (url[:60], answer.text[:200])
        error = answer.json()["error"]
        assert error["code"] == code, (url[:60], error)
        assert len(error["message"]) < 300, error["message"]
    assert [a.status_code for a in odd_ids] == [404, 404, 404]
