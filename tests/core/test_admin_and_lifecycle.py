"""Admin events, pinned backends, idle TTL, the queue limit and the lifecycle table."""

from __future__ import annotations

import pytest

from tests.core.harness import Harness, gpu, host
from yard.core import (
    AdminForgetProfile,
    AdminLoad,
    AdminPin,
    AdminUnload,
    BackendSpec,
    BackendState,
    Flag,
    IllegalTransition,
    Reject,
    SchedulerConfig,
    StartBackend,
    StopBackend,
    Tick,
    views,
)
from yard.core.lifecycle import TRANSITIONS, Move, can_move, move


def two_models(**specs: object) -> Harness:
    return Harness(
        [
            BackendSpec(name="chat", gpus=("gpu0",), **specs),  # type: ignore[arg-type]
            BackendSpec(name="big", gpus=("gpu0",)),
        ],
        profiles={"chat": (10, 1, 5), "big": (16, 1, 20)},
    )


def test_an_idle_backend_is_stopped_after_its_idle_ttl() -> None:
    h = two_models(idle_ttl_s=60.0)
    h.load("chat", "r1")
    h.finish("r1", at=10)
    assert h.s.next_wakeup() == 70
    assert h.tick(69) == []
    [stop] = h.tick(70)
    assert isinstance(stop, StopBackend) and "idle for 60.0 s" in stop.reason


def test_new_work_resets_the_idle_ttl() -> None:
    h = two_models(idle_ttl_s=60.0)
    h.load("chat", "r1")
    h.finish("r1", at=10)
    h.arrive("r2", "chat", at=50)
    h.finish("r2", at=55)
    assert h.tick(70) == []
    assert h.stops() == []
    assert [type(d) for d in h.tick(115)] == [StopBackend]


def test_a_pinned_backend_starts_on_the_first_event_and_is_never_evicted() -> None:
    h = Harness([BackendSpec(name="chat", gpus=("gpu0",), pinned=True)])
    [start] = h.feed(Tick())
    assert isinstance(start, StartBackend) and start.backend == "chat" and start.measure
    h = two_models(pinned=True)  # its first event was the stored profile
    assert h.started() == ["chat"]
    h.ready("chat", at=5)
    assert h.arrive("r1", "big", at=6) == []
    view = h.s.explain("r1", 6)
    assert view is not None and "chat is pinned" in view.reason


def test_admin_load_starts_a_backend_that_fits() -> None:
    h = two_models()
    [start] = h.feed(AdminLoad(backend="big"))
    assert isinstance(start, StartBackend) and start.backend == "big"


def test_admin_load_flags_why_it_cannot_load_now() -> None:
    h = two_models()
    h.load("chat", "r1")
    [flag] = h.feed(AdminLoad(backend="big"), at=1)
    assert isinstance(flag, Flag) and "big needs 17.6 GiB" in flag.reason


def test_admin_unload_drains_then_stops() -> None:
    h = two_models()
    h.load("chat", "r1")
    assert h.feed(AdminUnload(backend="chat"), at=1) == []
    assert h.state("chat") == "draining"
    [stop] = h.finish("r1", at=2)
    assert isinstance(stop, StopBackend) and "operator" in stop.reason


def test_admin_pin_loads_and_unpin_allows_eviction() -> None:
    h = two_models()
    [start] = h.feed(AdminPin(backend="chat", pinned=True))
    assert isinstance(start, StartBackend)
    h.ready("chat", at=5)
    assert h.arrive("r1", "big", at=6) == []
    h.feed(AdminPin(backend="chat", pinned=False), at=7)
    assert h.stops() == ["chat"]


def test_forgetting_a_profile_measures_the_next_load_alone() -> None:
    h = two_models()
    h.feed(AdminForgetProfile(backend="chat"))
    [start] = h.arrive("r1", "chat", at=1)
    assert isinstance(start, StartBackend) and start.measure
    assert h.s.profile("chat") is None


def test_more_than_queue_limit_waiting_is_refused_with_retry_after() -> None:
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",))],
        config=SchedulerConfig(queue_limit=2, default_service_s=7),
        profiles={"chat": (1, 1, 1)},
    )
    h.arrive("r1", "chat")
    h.arrive("r2", "chat")
    [reject] = h.arrive("r3", "chat")
    assert isinstance(reject, Reject) and (reject.status, reject.code) == (503, "queue_full")
    assert reject.retry_after_s == 7


def test_every_decision_carries_a_reason() -> None:
    h = two_models(idle_ttl_s=30.0)
    h.load("chat", "r1")
    h.arrive("r2", "big", at=1)
    h.finish("r1", at=2)
    h.stopped("chat", at=3)
    h.ready("big", at=20)
    h.arrive("r3", "nope", at=21)
    h.tick(100)
    assert len(h.log) >= 6
    assert all(d.reason.strip() for _, d in h.log)


def test_snapshot_shows_devices_backends_and_the_queue_in_order() -> None:
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",))],
        devices=(gpu(gib=24, reserve_gib=2), host()),
        profiles={"chat": (10, 1, 5)},
    )
    h.load("chat", "r0")
    h.arrive("low", "chat", priority=1, at=1)
    h.arrive("high", "chat", priority=99, at=2)
    h.memory("gpu0", used_gib=12, at=3, chat=9)
    snap = h.s.snapshot(3)
    assert [q.request_id for q in snap.queue] == ["high", "low"]
    assert [q.position for q in snap.queue] == [0, 1]
    assert snap.queue_length == 2
    [dev, _host] = snap.devices
    assert dev.committed_bytes == 11 * 1024**3
    assert dev.foreign_bytes == 3 * 1024**3
    assert dev.free_bytes == (22 - 11 - 3) * 1024**3
    [chat] = snap.backends
    assert (chat.state, chat.inflight, chat.queued) == ("ready", 1, 2)
    view = h.s.explain("low", 3)
    assert view is not None and view.reason.startswith("behind 1 request(s)")


def test_a_snapshot_without_the_queue_does_not_sort_it(monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness([BackendSpec(name="chat", gpus=("gpu0",))], profiles={"chat": (10, 1, 5)})
    h.load("chat", "r0")
    for i in range(3):
        h.arrive(f"q{i}", "chat", priority=i, at=1 + i)

    def no_sorting(*args: object) -> object:
        raise AssertionError("snapshot(limit=0) sorted the queue")

    monkeypatch.setattr(views, "dispatch_order", no_sorting)
    snap = h.s.snapshot(5, limit=0)
    assert snap.queue == () and snap.queue_length == 3
    [chat] = snap.backends
    assert chat.queued == 3


def test_the_lifecycle_table_names_state_and_event_on_an_illegal_move() -> None:
    with pytest.raises(IllegalTransition, match="chat: cannot 'ready' while 'stopped'"):
        move("chat", BackendState.STOPPED, Move.READY)


def test_the_lifecycle_table_allows_the_documented_paths_only() -> None:
    assert move("x", BackendState.STOPPED, Move.START) is BackendState.STARTING
    assert move("x", BackendState.DRAINING, Move.UNDRAIN) is BackendState.READY
    assert not can_move(BackendState.STARTING, Move.STOP)  # a load is never cut short
    assert not can_move(BackendState.STOPPING, Move.EXITED)  # BackendStopped follows
    reachable = {BackendState.STOPPED}
    for _ in range(5):
        reachable |= {new for (old, _m), new in TRANSITIONS.items() if old in reachable}
    assert reachable == set(BackendState)


def test_explain_agrees_with_the_snapshot_order() -> None:
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",)), BackendSpec(name="big", gpus=("gpu0",))],
        profiles={"chat": (10, 1, 5), "big": (16, 1, 20)},
    )
    h.load("chat", "r0")
    for i, (backend, prio) in enumerate([("chat", 10), ("big", 90), ("chat", 70), ("big", 5)]):
        h.arrive(f"q{i}", backend, priority=prio, at=1 + i)
    snap = h.s.snapshot(10)
    assert [q.request_id for q in snap.queue] == ["q1", "q2", "q0", "q3"]
    for q in snap.queue:
        assert h.s.explain(q.request_id, 10) == q
    assert h.s.explain("r0", 10) is None  # running, not waiting
