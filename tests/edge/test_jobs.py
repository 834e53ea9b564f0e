"""Jobs at the edge: times out of range never poison the store."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.edge.conftest import APP, APPS, OTHER_KEY
from tests.edge.harness import (
    Yard,
    echo_toml,
    exchange,
    get,
    healthz_answers,
    post,
    request_bytes,
    start_yard,
)

pytestmark = pytest.mark.slow

CHAT = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Yard-Start-Within", "1e20"),
        ("X-Yard-Start-Within", "1e308"),
        ("X-Yard-Start-By", "9999-12-31T23:59:59-23:59"),
        ("X-Yard-Start-By", "0001-01-01T00:00:00+23:59"),
    ],
)
def test_an_out_of_range_time_is_refused_before_a_job_is_stored(
    yard: Yard, header: str, value: str
) -> None:
    before = get(yard, "/v1/jobs?limit=100", headers=APP)
    assert before.status == 200, before.body[:300]
    answer = post(
        yard,
        "/v1/chat/completions",
        CHAT,
        headers={**APP, "Prefer": "respond-async", header: value},
    )
    assert answer.status == 400, (answer.status, answer.body[:300])
    after = get(yard, "/v1/jobs?limit=100", headers=APP)
    assert after.status == 200, after.body[:300]
    assert after.json()["data"] == before.json()["data"]


def test_a_job_can_be_read_and_its_result_fetched(yard: Yard) -> None:
    accepted = post(yard, "/v1/chat/completions", CHAT, headers={**APP, "Prefer": "respond-async"})
    assert accepted.status == 202
    location = accepted.header(b"location")
    assert location is not None
    result = get(yard, location.decode() + "/result?wait=30", headers=APP, timeout=40)
    assert result.status == 200, result.body[:300]


@pytest.mark.parametrize("wait", ["nan", "-1", "inf", "1e999", "x"])
def test_a_bad_wait_is_a_400(yard: Yard, wait: str) -> None:
    answer = get(yard, f"/v1/jobs/nope?wait={wait}", headers=APP)
    assert answer.status in (400, 404), (answer.status, answer.body[:300])


def test_an_unknown_job_is_a_404_in_the_error_shape(yard: Yard) -> None:
    answer = get(yard, "/v1/jobs/does-not-exist", headers=APP)
    assert answer.status == 404
    assert answer.error_code() == "job_not_found"


@pytest.fixture(scope="module")
def quota(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    """yard whose apps may keep 3 jobs and 1 MiB of job bytes each."""
    running = start_yard(
        tmp_path_factory.mktemp("quota"),
        APPS + echo_toml() + '[jobs]\nmax_jobs_per_app = 3\nmax_stored_bytes_per_app = "1MiB"\n\n',
    )
    try:
        yield running
    finally:
        running.stop()


def test_jobs_past_the_count_quota_are_refused_until_a_result_is_deleted(quota: Yard) -> None:
    async_ = {**APP, "Prefer": "respond-async"}
    locations = []
    for _ in range(3):
        accepted = post(quota, "/v1/chat/completions", CHAT, headers=async_)
        assert accepted.status == 202, (accepted.status, accepted.body[:300])
        location = accepted.header(b"location")
        assert location is not None
        locations.append(location.decode())
    refused = post(quota, "/v1/chat/completions", CHAT, headers=async_)
    assert refused.status == 429, (refused.status, refused.body[:300])
    assert refused.error_code() == "too_many_jobs"
    done = get(quota, locations[0] + "/result?wait=30", headers=APP, timeout=40)
    assert done.status == 200
    deleted = exchange(quota, request_bytes("DELETE", locations[0] + "/result", headers=APP))
    assert deleted.status == 200, (deleted.status, deleted.body[:300])
    again = post(quota, "/v1/chat/completions", CHAT, headers=async_)
    assert again.status == 202, (again.status, again.body[:300])


def test_a_job_larger_than_the_byte_quota_is_refused(quota: Yard) -> None:
    body = json.dumps({"model": "tiny", "messages": [], "pad": "x" * (1200 * 1024)}).encode()
    headers = {"Authorization": f"Bearer {OTHER_KEY}", "Prefer": "respond-async"}
    with healthz_answers(quota):
        refused = post(quota, "/v1/chat/completions", body, headers=headers)
    assert refused.status == 507, (refused.status, refused.body[:300])
    assert refused.error_code() == "job_storage_full"
