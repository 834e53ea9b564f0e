"""Memory fit, eviction, loading alone, foreign memory, exclusive and several GPUs."""

from __future__ import annotations

from tests.core.harness import GIB, Harness, gpu, host
from yard.core import (
    BackendSpec,
    Flag,
    ProfileMeasured,
    Reject,
    SchedulerConfig,
    StartBackend,
    StopBackend,
)


def two_models(**kw: object) -> Harness:
    """chat (10 GiB) and big (16 GiB) share a 24 GiB gpu0: one at a time."""
    return Harness(
        [BackendSpec(name="chat", gpus=("gpu0",)), BackendSpec(name="big", gpus=("gpu0",))],
        profiles={"chat": (10, 1, 5), "big": (16, 1, 20)},
        **kw,  # type: ignore[arg-type]
    )


def test_a_backend_starts_on_a_device_where_its_reservation_fits() -> None:
    h = two_models()
    [start] = h.arrive("r1", "chat")
    assert isinstance(start, StartBackend) and start.gpus == ("gpu0",)
    assert "11.0 GiB" in start.reason  # 10 GiB x margin 1.1


def test_a_swap_stops_the_idle_backend_and_starts_only_once_its_memory_is_free() -> None:
    h = two_models()
    h.load("chat", "r1")
    h.finish("r1", at=1)
    [stop] = h.arrive("r2", "big", at=2)
    assert isinstance(stop, StopBackend) and stop.backend == "chat"
    assert "big" in stop.reason and "least demand" in stop.reason
    assert h.tick(3) == []  # chat still holds its memory
    [start] = h.stopped("chat", at=4)
    assert isinstance(start, StartBackend) and start.backend == "big"


def test_swap_waits_for_inflight_requests_to_drain() -> None:
    h = two_models(config=SchedulerConfig(batch_bound=0))
    h.load("chat", "r1")
    assert h.arrive("r2", "big", at=1) == []
    assert h.state("chat") == "draining"
    view = h.s.explain("r2", 1)
    assert view is not None and "busy chat must finish before the swap" in view.reason
    h.arrive("r3", "chat", at=2, priority=10)  # lower than r2: no new work for chat
    [stop] = h.finish("r1", at=3)
    assert isinstance(stop, StopBackend) and stop.backend == "chat"
    assert h.dispatched() == ["r1"]


def test_a_busy_backend_whose_requests_rank_higher_is_not_evicted() -> None:
    h = two_models()
    h.load("chat", "r1")
    h.arrive("r2", "chat", priority=90, at=1)  # waits for chat's only slot
    assert h.arrive("r3", "big", priority=10, at=2) == []
    assert h.state("chat") == "ready"
    h.finish("r1", at=3)
    assert h.dispatched() == ["r1", "r2"]


def test_eviction_stops_the_cheapest_idle_backends_and_only_as_many_as_needed() -> None:
    h = Harness(
        [
            BackendSpec(name="a", gpus=("gpu0",)),
            BackendSpec(name="b", gpus=("gpu0",)),
            BackendSpec(name="c", gpus=("gpu0",)),
            BackendSpec(name="big", gpus=("gpu0",)),
        ],
        devices=(gpu(gib=40), host()),
        profiles={"a": (10, 1, 30), "b": (10, 1, 2), "c": (10, 1, 9), "big": (20, 1, 5)},
    )
    for name in ("a", "b", "c"):
        h.load(name, f"r-{name}")
        h.finish(f"r-{name}")
    h.arrive("r", "big", at=1)  # 40 - 33 = 7 GiB free, needs 22: two must go
    assert h.stops() == ["b", "c"]


def test_eviction_drops_a_cheap_victim_that_a_later_bigger_one_made_spare() -> None:
    # small (4 GiB) is the cheapest to reload per GiB, so it is picked first; it
    # is not enough, so large (16 GiB) is picked too, and large alone is enough:
    # small must stay loaded. (Stop no more than needed.)
    h = Harness(
        [
            BackendSpec(name="small", gpus=("gpu0",)),
            BackendSpec(name="large", gpus=("gpu0",)),
            BackendSpec(name="new", gpus=("gpu0",)),
        ],
        devices=(gpu(gib=24), host()),
        profiles={"small": (4, 1, 2), "large": (16, 1, 20), "new": (14, 1, 5)},
    )
    for name in ("small", "large"):
        h.load(name, f"r-{name}")
        h.finish(f"r-{name}")
    # 24 - 4.4 - 17.6 = 2 GiB free; new needs 15.4: small frees 4.4, large 17.6
    h.arrive("r", "new", at=1)
    assert h.stops() == ["large"]


def test_eviction_prefers_backends_nobody_waits_for() -> None:
    h = Harness(
        [BackendSpec(name=n, gpus=("gpu0",), slots=1) for n in ("a", "b", "big")],
        devices=(gpu(gib=30), host()),
        profiles={"a": (10, 1, 1), "b": (10, 1, 50), "big": (15, 1, 5)},
    )
    h.load("a", "ra")
    h.load("b", "rb")
    h.finish("rb", at=1)
    h.arrive("queued-for-a", "a", priority=0, at=1)  # a is busy, one request waits
    h.arrive("r", "big", priority=100, at=2)
    assert h.stops() == ["b"]


def test_foreign_memory_counts_against_the_fit() -> None:
    h = two_models()
    h.memory("gpu0", used_gib=14)  # somebody else uses 14 GiB
    assert h.arrive("r1", "chat") == []
    view = h.s.explain("r1", 0)
    assert view is not None and "needs 11.0 GiB, 10.0 GiB free" in view.reason
    [start] = h.memory("gpu0", used_gib=2, at=5)
    assert isinstance(start, StartBackend)


def test_live_use_above_the_reservation_counts_against_the_fit() -> None:
    h = Harness(
        [BackendSpec(name="a", gpus=("gpu0",)), BackendSpec(name="b", gpus=("gpu0",))],
        profiles={"a": (8, 1, 1), "b": (8, 1, 1)},
    )
    h.load("a", "ra")
    h.memory("gpu0", used_gib=16, a=16)  # a grew from 8.8 reserved to 16 GiB
    assert h.arrive("rb", "b", at=1) == []  # 24 - 16 < 8.8
    assert h.started() == ["a"]


def test_a_backend_without_a_profile_loads_alone_and_is_measured() -> None:
    h = Harness(
        [BackendSpec(name="known", gpus=("gpu0",)), BackendSpec(name="new", gpus=("gpu0",))],
        profiles={"known": (2, 1, 1)},
    )
    h.load("known", "r1")
    h.finish("r1", at=1)
    [stop] = h.arrive("r2", "new", at=2)  # 22 GiB free, but its size is unknown
    assert isinstance(stop, StopBackend) and stop.backend == "known"
    [start] = h.stopped("known", at=3)
    assert isinstance(start, StartBackend) and start.measure
    h.arrive("r3", "known", priority=100, at=4)
    assert h.started() == ["known", "new"]  # nothing loads next to an unmeasured one


def test_nothing_loads_next_to_a_measured_backend_until_its_profile_arrives() -> None:
    h = Harness(
        [BackendSpec(name="new", gpus=("gpu0",)), BackendSpec(name="small", gpus=("gpu0",))],
        profiles={"small": (1, 1, 1)},
    )
    h.load("new", "r1")
    h.arrive("r2", "small", at=1)
    assert h.started() == ["new"]
    h.feed(ProfileMeasured(backend="new", gpu_bytes=5 * GIB, host_bytes=GIB, load_s=3), at=2)
    assert h.started() == ["new", "small"]


def test_one_load_at_a_time_per_device() -> None:
    h = Harness(
        [BackendSpec(name="a", gpus=("gpu0",)), BackendSpec(name="b", gpus=("gpu0",))],
        profiles={"a": (2, 1, 5), "b": (2, 1, 5)},
    )
    h.arrive("ra", "a")
    assert h.arrive("rb", "b", at=1) == []
    view = h.s.explain("rb", 1)
    assert view is not None and "a is loading there" in view.reason
    h.ready("a", at=5)
    assert h.started() == ["a", "b"]


def test_a_request_that_cannot_fit_even_on_an_empty_machine_is_refused_at_once() -> None:
    h = Harness([BackendSpec(name="huge", gpus=("gpu0",))], profiles={"huge": (30, 1, 5)})
    [reject] = h.arrive("r1", "huge")
    assert isinstance(reject, Reject) and (reject.status, reject.code) == (503, "does_not_fit")
    assert "needs 33.0 GiB on gpu0, usable 24.0 GiB" in reject.message


def test_a_request_for_an_unknown_backend_is_refused_with_404() -> None:
    h = two_models()
    [reject] = h.arrive("r1", "nope")
    assert isinstance(reject, Reject) and (reject.status, reject.code) == (404, "model_not_found")


def test_a_late_memory_reading_for_a_stopped_backend_is_ignored() -> None:
    h = two_models()
    h.load("chat", "r1")
    h.finish("r1", at=1)
    h.arrive("r2", "big", at=2)
    h.stopped("chat", at=3)
    assert h.memory("gpu0", used_gib=10, at=4, chat=10) == []
    snap = h.s.snapshot(4)
    assert "chat" not in snap.devices[0].live_bytes


def test_the_device_reserve_is_kept_free() -> None:
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",))],
        devices=(gpu(gib=24, reserve_gib=14), host()),
        profiles={"chat": (10, 1, 5)},
    )
    [reject] = h.arrive("r1", "chat")
    assert isinstance(reject, Reject) and "usable 10.0 GiB" in reject.message


def test_host_memory_must_fit_too() -> None:
    h = Harness(
        [BackendSpec(name="a"), BackendSpec(name="b")],
        devices=(host(gib=16),),
        profiles={"a": (0, 8, 1), "b": (0, 8, 1)},
    )
    h.load("a", "ra")
    assert h.arrive("rb", "b", at=1) == []  # 8.8 + 8.8 > 16
    assert h.started() == ["a"]


def test_several_gpus_place_a_backend_where_no_eviction_is_needed() -> None:
    h = Harness(
        [
            BackendSpec(name="a", gpus=("gpu0",)),
            BackendSpec(name="b", gpus=("gpu0", "gpu1")),
        ],
        devices=(gpu("gpu0", 24), gpu("gpu1", 24), host()),
        profiles={"a": (16, 1, 1), "b": (16, 1, 1)},
    )
    h.load("a", "ra")
    [start] = h.arrive("rb", "b", at=1)
    assert isinstance(start, StartBackend) and start.gpus == ("gpu1",)


def test_several_gpus_tie_break_by_most_free_memory_then_name() -> None:
    h = Harness(
        [BackendSpec(name="x", gpus=("gpu1", "gpu0"))],
        devices=(gpu("gpu0", 24), gpu("gpu1", 24), host()),
        profiles={"x": (4, 1, 1)},
    )
    [start] = h.arrive("r", "x")
    assert isinstance(start, StartBackend) and start.gpus == ("gpu0",)


def test_a_backend_spanning_two_gpus_needs_room_on_both() -> None:
    h = Harness(
        [
            BackendSpec(name="a", gpus=("gpu1",)),
            BackendSpec(name="wide", gpus=("gpu0", "gpu1"), gpu_count=2),
        ],
        devices=(gpu("gpu0", 24), gpu("gpu1", 24), host()),
        profiles={"a": (16, 1, 1), "wide": (12, 1, 1)},
    )
    h.load("a", "ra")
    h.finish("ra", at=1)
    [stop] = h.arrive("rw", "wide", at=2)
    assert isinstance(stop, StopBackend) and stop.backend == "a"
    [start] = h.stopped("a", at=3)
    assert isinstance(start, StartBackend) and start.gpus == ("gpu0", "gpu1")


def test_an_exclusive_device_holds_one_backend_at_a_time() -> None:
    h = Harness(
        [BackendSpec(name="a", gpus=("gpu0",)), BackendSpec(name="b", gpus=("gpu0",))],
        devices=(gpu(gib=80, exclusive=True), host()),
        profiles={"a": (1, 1, 1), "b": (1, 1, 1)},
    )
    h.load("a", "ra")
    h.finish("ra", at=1)
    [stop] = h.arrive("rb", "b", at=2)
    assert isinstance(stop, StopBackend) and stop.backend == "a"


def test_a_host_only_backend_uses_host_memory_only() -> None:
    h = Harness(
        [BackendSpec(name="gpuy", gpus=("gpu0",)), BackendSpec(name="cpu")],
        devices=(gpu(gib=10), host(gib=64)),
        profiles={"gpuy": (9, 1, 1), "cpu": (0, 4, 1)},
    )
    h.load("gpuy", "r1")
    [start] = h.arrive("r2", "cpu", at=1)
    assert isinstance(start, StartBackend) and start.gpus == ()


def test_a_wait_for_memory_is_explained_with_figures() -> None:
    h = two_models()
    h.memory("gpu0", used_gib=20)
    h.arrive("r1", "big")
    view = h.s.explain("r1", 0)
    assert view is not None
    assert view.reason == "waiting for gpu0: big needs 17.6 GiB, 4.0 GiB free"
    assert not any(isinstance(d, Flag) for _, d in h.log)


def test_eviction_weighs_reload_cost_against_recent_use() -> None:
    """GreedyDual-Size: cheapest to reload per GiB first, but every eviction
    raises the bar, so a backend used since outlives one idle for long."""
    h = Harness(
        [BackendSpec(name=n, gpus=("gpu0",)) for n in "abcd"],
        devices=(gpu(gib=18), host()),
        profiles={"a": (5, 0, 2), "b": (5, 0, 2.5), "c": (5, 0, 1), "d": (5, 0, 4)},
    )
    for t, name in enumerate("abc"):
        h.load(name, f"r-{name}", at=t)
        h.finish(f"r-{name}")
    h.arrive("r1", "d", at=10)
    assert h.stops() == ["c"]  # cheapest to reload
    h.stopped("c", at=11)
    h.ready("d", at=15)
    h.finish("r1", at=16)
    h.arrive("r2", "a", at=20)  # a is used again
    h.finish("r2", at=21)
    h.arrive("r3", "c", at=30)
    assert h.stops() == ["c", "b"]  # not a, though a reloads faster: b sat idle longer
