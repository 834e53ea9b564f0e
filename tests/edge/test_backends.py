"""Backends that lie (:mod:`tests.edge.liar`): each lie ends as ``502
backend_failed`` in yard's error shape (never a malformed answer, never a
500), and the next request to the same backend is served normally."""

from __future__ import annotations

import pytest

from tests.edge.conftest import APP
from tests.edge.harness import Yard, error_shape_ok, get, healthz_answers
from yard.observe.auth import COOKIE

pytestmark = pytest.mark.slow


def _ok_after(yard: Yard) -> None:
    again = get(yard, "/backends/liar/ok", headers=APP)
    assert again.status == 200, (again.status, again.body[:300])
    assert again.json() == {"ok": True}


def test_an_honest_answer_passes(yard: Yard) -> None:
    _ok_after(yard)


def test_a_backend_that_answers_garbage_gets_a_502(yard: Yard) -> None:
    with healthz_answers(yard):
        answer = get(yard, "/backends/liar/garbage", headers=APP)
    assert answer.status == 502, (answer.status, answer.headers, answer.body[:300])
    assert error_shape_ok(answer)
    assert answer.error_code() == "backend_failed"
    _ok_after(yard)


@pytest.mark.parametrize(
    "lie",
    ["te-and-cl", "bare-cr", "status-99", "huge-head"],
)
def test_a_lying_backend_answer_is_a_502(yard: Yard, lie: str) -> None:
    with healthz_answers(yard):
        answer = get(yard, f"/backends/liar/{lie}", headers=APP)
    assert answer.status == 502, (answer.status, answer.headers, answer.body[:300])
    assert error_shape_ok(answer)
    assert answer.error_code() == "backend_failed"
    _ok_after(yard)


def test_a_backend_cookie_named_like_yards_session_never_reaches_the_client(yard: Yard) -> None:
    answer = get(yard, "/backends/liar/set-cookie", headers=APP)
    assert answer.status == 200
    cookies = [v.split(b"=")[0].strip() for v in answer.header_values(b"set-cookie")]
    assert COOKIE.encode() not in cookies
    assert b"other" in cookies


def test_a_body_longer_than_its_content_length_never_reaches_the_next_answer(yard: Yard) -> None:
    # The declared length is the answer (RFC 9112 6.3); what follows it is
    # not passed on, and the backend connection is not used again.
    with healthz_answers(yard):
        answer = get(yard, "/backends/liar/short-cl", headers=APP)
    assert answer.status in (200, 502), (answer.status, answer.body[:300])
    if answer.status == 200:
        assert answer.body == b"hello"
    else:
        assert answer.error_code() == "backend_failed"
    _ok_after(yard)
