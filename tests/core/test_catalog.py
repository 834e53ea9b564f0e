"""Backends that come and go while yard runs (yard.core.catalog): added ones
are served, removed ones drain and stop, changed ones restart once idle."""

from __future__ import annotations

from tests.core.harness import Harness, of
from yard.core import BackendSpec, Dispatch, Reject, StartBackend, StopBackend
from yard.core.events import BackendsChanged


def chat_only() -> Harness:
    return Harness(
        [BackendSpec(name="chat", gpus=("gpu0",))],
        profiles={"chat": (10, 1, 5), "new": (4, 1, 2)},
    )


def test_an_added_backend_is_started_for_its_first_request() -> None:
    h = chat_only()
    h.feed(BackendsChanged(added=(BackendSpec(name="new", gpus=("gpu0",)),)))
    [start] = of(StartBackend, h.arrive("r1", "new"))
    assert start.backend == "new"
    [dispatch] = of(Dispatch, h.ready("new"))
    assert (dispatch.request_id, dispatch.backend) == ("r1", "new")


def test_a_removed_backend_finishes_what_runs_then_stops_and_is_forgotten() -> None:
    h = chat_only()
    h.load("chat", "r1", at=0)
    out = h.feed(BackendsChanged(removed=("chat",)), at=1)
    assert of(StopBackend, out) == []  # r1 still runs on it
    assert h.s.snapshot(1).backends[0].state == "draining"
    [stop] = of(StopBackend, h.finish("r1", at=2))
    assert "removed from the configuration" in stop.reason
    h.stopped("chat", at=3)
    assert [b.name for b in h.s.snapshot(3).backends] == []
    [refused] = of(Reject, h.arrive("r2", "chat", at=4))
    assert refused.status == 404


def test_a_removed_backend_that_is_not_loaded_refuses_what_waits_at_once() -> None:
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",)), BackendSpec(name="big", gpus=("gpu0",))],
        profiles={"chat": (10, 1, 5), "big": (20, 1, 5)},
    )
    h.load("big", "r1", at=0)
    h.arrive("r2", "chat", at=1)  # waits: big holds the GPU and serves r1
    out = h.feed(BackendsChanged(removed=("chat",)), at=2)
    [refused] = of(Reject, out)
    assert (refused.request_id, refused.status, refused.code) == ("r2", 404, "model_removed")
    assert "big" in [b.name for b in h.s.snapshot(2).backends]
    assert "chat" not in [b.name for b in h.s.snapshot(2).backends]


def test_a_changed_backend_restarts_with_its_new_spec_once_idle() -> None:
    h = chat_only()
    h.load("chat", "r1", at=0)
    h.arrive("r2", "chat", at=1)  # one slot: r2 waits behind r1
    changed = BackendSpec(name="chat", gpus=("gpu0",), slots=2)
    out = h.feed(BackendsChanged(replaced=(changed,)), at=2)
    assert of(StopBackend, out) == []  # never stopped while it serves
    out = h.finish("r1", at=3)
    [stop] = of(StopBackend, out)
    assert "configuration changed" in stop.reason
    assert of(Dispatch, out) == []  # r2 waits for the new process
    [start] = of(StartBackend, h.stopped("chat", at=4))
    assert start.backend == "chat"
    [dispatch] = of(Dispatch, h.ready("chat", at=5))
    assert dispatch.request_id == "r2"
    assert h.s.snapshot(5).backends[0].slots == 2


def test_a_stopped_backend_takes_its_new_spec_at_once() -> None:
    h = chat_only()
    h.feed(BackendsChanged(replaced=(BackendSpec(name="chat", gpus=("gpu0",), slots=3),)))
    assert h.s.snapshot(0).backends[0].slots == 3
    [start] = of(StartBackend, h.arrive("r1", "chat"))
    assert start.backend == "chat"
