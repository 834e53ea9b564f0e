"""Backends that lie (:mod:`tests.edge.liar`): each lie ends as ``502
backend_failed`` in yard's error shape (never a malformed answer, never a
500), and the next request to the same backend is served normally."""

from __future__ import annotations

import pytest

from tests.edge.conftest import APP
from tests.edge.harness import Yard, error_shape_ok, get, healthz_answers

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
