"""Auth at the edge: DNS rebinding and cross-site requests in the no-key
demo mode, login guessing and sessions with an admin key."""

from __future__ import annotations

import pytest

from tests.edge.conftest import ADMIN_KEY
from tests.edge.harness import Yard, exchange, get, healthz_answers, post, request_bytes
from yard.observe.auth import COOKIE

pytestmark = pytest.mark.slow

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.mark.parametrize("path", ["/admin/status", "/v1/jobs", "/v1/models", "/dashboard"])
def test_a_foreign_host_header_is_refused(keyless: Yard, path: str) -> None:
    answer = get(keyless, path, headers={"Host": "rebind.attacker.example"})
    assert 400 <= answer.status < 500, (answer.status, answer.body[:300])


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_the_listen_address_and_localhost_are_accepted_hosts(keyless: Yard, host: str) -> None:
    answer = get(keyless, "/admin/status", headers={"Host": f"{host}:{keyless.port}"})
    assert answer.status == 200, (answer.status, answer.body[:300])


def test_a_cross_site_form_post_cannot_unload_a_backend(keyless: Yard) -> None:
    data = request_bytes(
        "POST",
        "/admin/backends/llm/unload",
        headers={**FORM, "Origin": "http://attacker.example"},
        body=b"x=1",
    )
    answer = exchange(keyless, data)
    assert answer.status == 403, (answer.status, answer.body[:300])


def test_a_same_origin_admin_call_still_works(keyless: Yard) -> None:
    data = request_bytes(
        "POST",
        "/admin/backends/llm/pin",
        headers={"Host": f"127.0.0.1:{keyless.port}", "Origin": keyless.url, "X-Yard-Admin": "1"},
        body=b"",
    )
    answer = exchange(keyless, data)
    assert answer.status == 202, (answer.status, answer.body[:300])


def _login(yard: Yard, key: str) -> tuple[int, str | None]:
    answer = post(yard, "/dashboard/login", f"key={key}".encode(), headers=FORM)
    for value in answer.header_values(b"set-cookie"):
        name, _, rest = value.decode("latin-1").partition("=")
        if name.strip() == COOKIE:
            return answer.status, rest.split(";")[0]
    return answer.status, None


def test_a_session_ends_at_logout(yard: Yard) -> None:
    status, session = _login(yard, ADMIN_KEY)
    assert status == 303 and session
    cookie = {"Cookie": f"{COOKIE}={session}"}
    assert get(yard, "/admin/status", headers=cookie).status == 200
    out = exchange(
        yard, request_bytes("POST", "/dashboard/logout", headers={**cookie, **FORM}, body=b"")
    )
    assert out.status in (200, 303)
    assert get(yard, "/admin/status", headers=cookie).status == 401


def test_two_logins_get_different_sessions(yard: Yard) -> None:
    _, first = _login(yard, ADMIN_KEY)
    _, second = _login(yard, ADMIN_KEY)
    assert first and second and first != second


def test_guessing_the_admin_key_is_slowed_down(yard: Yard) -> None:
    statuses = []
    with healthz_answers(yard):
        for i in range(60):
            statuses.append(_login(yard, f"guess-{i}")[0])
            if statuses[-1] == 429:
                break
    assert 429 in statuses, statuses
    assert set(statuses) <= {401, 429}
