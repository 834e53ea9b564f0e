"""A load's progress shows in the reasons of its backend and of the requests waiting on it."""

from __future__ import annotations

from tests.core.harness import Harness
from yard.core import BackendLoading, BackendSpec


def test_a_request_waiting_on_a_load_says_how_far_the_warm_up_is() -> None:
    h = Harness([BackendSpec(name="llm", gpus=("gpu0",))])
    h.arrive("r1", "llm")
    h.arrive("r2", "llm", at=1)
    assert h.feed(BackendLoading(backend="llm", progress="warm-up 40 % (2 of 5)"), at=2) == []
    view = h.s.explain("r2", 2)
    assert view is not None and "loading: warm-up 40 % (2 of 5)" in view.reason
    [backend] = h.s.snapshot(2).backends
    assert backend.reason.endswith("; warm-up 40 % (2 of 5)")
    h.ready("llm", at=3)
    [backend] = h.s.snapshot(3).backends
    assert "warm-up" not in backend.reason


def test_progress_for_a_backend_that_is_not_loading_is_ignored() -> None:
    h = Harness([BackendSpec(name="llm", gpus=("gpu0",))])
    h.feed(BackendLoading(backend="llm", progress="warm-up 10 %"))
    h.feed(BackendLoading(backend="nope", progress="warm-up 10 %"))
    [backend] = h.s.snapshot(0).backends
    assert "warm-up" not in backend.reason
