"""Several instances of one backend: the routing function, and the core driven by events."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.core.harness import GIB, Harness, gpu, host, of
from yard.core import (
    BackendSpec,
    Dispatch,
    Flag,
    ProfileMeasured,
    SchedulerConfig,
    StartBackend,
    StopBackend,
)
from yard.core.instances import Option, choose, expected_wait

# -- the pure parts ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("load_left", "slots", "remaining", "queued", "expected"),
    [
        (0.0, 1, (), 0, 0.0),  # loaded, a slot free
        (0.0, 2, (50.0,), 0, 0.0),  # loaded, one of two slots free
        (0.0, 1, (90.0,), 0, 90.0),  # busy: the running one ends first
        (0.0, 1, (30.0,), 0, 30.0),  # ... and it has run 60 of its 90 s
        (0.0, 1, (30.0,), 2, 210.0),  # two waiting: 30 s, then two more of 90 s
        (0.0, 2, (10.0, 70.0), 1, 70.0),  # one waiting takes the slot freed at 10 s
        (0.0, 2, (10.0, 70.0), 2, 100.0),  # two waiting: the next frees at 10 + 90 s
        (25.0, 1, (), 0, 25.0),  # loading: the rest of its load
        (25.0, 1, (), 1, 115.0),  # loading, one waiting: the load, then that one
        (40.0, 2, (), 1, 40.0),  # not loaded, two slots, one waiting: one is left for it
    ],
)
def test_expected_wait(
    load_left: float, slots: int, remaining: tuple[float, ...], queued: int, expected: float
) -> None:
    got = expected_wait(
        load_left_s=load_left, slots=slots, remaining=remaining, queued=queued, service_s=90.0
    )
    assert got == expected


def test_choose_takes_the_least_wait_and_the_first_on_a_tie() -> None:
    a, b, c = (Option(name=n, wait_s=w, how="") for n, w in (("a", 40.0), ("b", 40.0), ("c", 41)))
    assert choose([a, b, c]) is a
    assert choose([c, b, a]) is b
    assert choose([c]) is c


def test_an_instance_to_be_loaded_must_save_a_quarter_of_its_start() -> None:
    loaded = Option(name="news", wait_s=44.0, how="")
    load = Option(name="news@2", wait_s=40.0, how="", load_s=40.0)  # counts 50 s
    assert load.cost_s == 50.0
    assert choose([loaded, load]) is loaded
    busier = Option(name="news", wait_s=52.0, how="")
    assert choose([busier, load]) is load


# -- the core ---------------------------------------------------------------------------

NEWS = BackendSpec(name="news", gpus=("gpu0", "gpu1"), instances=2)
NEWS_2 = BackendSpec(name="news@2", gpus=("gpu0", "gpu1"), instances=2, instance_of="news")
LOAD_S = 40.0


def two_gpus(**profiles: tuple[float, float, float]) -> Harness:
    return Harness(
        [NEWS, NEWS_2],
        devices=(gpu("gpu0"), gpu("gpu1"), host()),
        profiles=profiles or {"news": (14, 2, LOAD_S)},
    )


def warm(h: Harness, service_s: float) -> StartBackend:
    """``r1`` loads ``news`` and is served there for ``service_s`` (the service
    time the core learns)."""
    [start] = of(StartBackend, h.arrive("r1", "news"))
    assert start.backend == "news"
    [d] = of(Dispatch, h.ready("news", at=LOAD_S))
    assert (d.request_id, d.backend) == ("r1", "news")
    h.finish("r1", at=LOAD_S + service_s)
    return start


def test_a_second_instance_takes_the_first_instances_profile() -> None:
    h = two_gpus()
    assert h.s.profile("news@2") == h.s.profile("news")
    assert h.s.profile("news") is not None


def test_a_short_wait_on_the_first_instance_loads_no_second() -> None:
    h = two_gpus()
    # Service times of 10 s measured: waiting behind one is quicker than a load.
    warm(h, 10.0)
    assert of(Dispatch, h.arrive("r2", "news", at=100.0))
    out = h.arrive("r3", "news", at=101.0)
    assert not of(StartBackend, out) and not of(Dispatch, out)
    assert h.s.explain("r3", h.now) is not None
    assert h.s.explain("r3", h.now).backend == "news"  # type: ignore[union-attr]


def test_a_long_wait_on_the_first_instance_loads_the_second_on_the_other_gpu() -> None:
    h = two_gpus()
    start = warm(h, 90.0)  # the service time learned: 90 s, more than a 40 s load
    [d] = of(Dispatch, h.arrive("r2", "news", at=200.0))
    assert d.backend == "news"
    out = h.arrive("r3", "news", at=201.0)
    [start2] = of(StartBackend, out)
    assert start2.backend == "news@2"
    assert start2.gpus != start.gpus  # no room for a second copy beside the first
    [flag] = [f for f in of(Flag, out) if f.request_id == "r3"]
    assert flag.backend == "news@2"
    assert flag.reason.startswith("r3: bound to news@2, the instance of news where it should")
    assert "news ready, 1 of 1 slots busy, 0 waiting (about 89.0 s until a slot)" in flag.reason
    assert "news@2 not loaded, starts in about 40.0 s" in flag.reason
    [d3] = of(Dispatch, h.ready("news@2", at=241.0))
    assert (d3.request_id, d3.backend) == ("r3", "news@2")
    # Early binding: r4 finds both busy; the first frees at 290 s, before news@2.
    out = h.arrive("r4", "news", at=250.0)
    assert h.s.explain("r4", h.now).backend == "news"  # type: ignore[union-attr]
    [d4] = of(Dispatch, h.finish("r2", at=290.0))
    assert (d4.request_id, d4.backend) == ("r4", "news")


def test_the_wait_behind_a_loading_second_instance_counts_its_queue() -> None:
    h = two_gpus()
    warm(h, 90.0)
    h.arrive("r2", "news", at=200.0)
    h.arrive("r3", "news", at=201.0)  # news@2 starts loading: ready at 241 s
    out = h.arrive("r4", "news", at=211.0)
    # news: r2 has 79 s left; news@2: 30 s of load, then r3's 90 s.
    assert h.s.explain("r4", h.now).backend == "news"  # type: ignore[union-attr]
    assert not of(StartBackend, out)
    [flag] = [f for f in of(Flag, out) if f.request_id == "r4"]
    assert "news@2 loading, 30.0 s left, 1 waiting (about 120 s until a slot)" in flag.reason


def test_no_second_instance_before_the_first_load_is_measured() -> None:
    h = Harness([NEWS, NEWS_2], devices=(gpu("gpu0"), gpu("gpu1"), host()))
    [start] = of(StartBackend, h.arrive("r1", "news"))
    assert start.backend == "news" and start.measure
    for i in range(2, 6):
        out = h.arrive(f"r{i}", "news", at=float(i))
        assert not of(StartBackend, out)
        assert h.s.explain(f"r{i}", h.now).backend == "news"  # type: ignore[union-attr]
    # The first load's measurement is the second instance's profile too.
    h.feed(
        ProfileMeasured(backend="news", gpu_bytes=14 * GIB, host_bytes=2 * GIB, load_s=LOAD_S),
        at=LOAD_S,
    )
    assert h.s.profile("news@2") == h.s.profile("news")


def test_a_second_copy_that_does_not_fit_beside_the_first_is_never_an_option() -> None:
    # One GPU: a second 14 GiB copy cannot sit beside the first; it must never
    # make room by evicting it.
    one = BackendSpec(name="news", gpus=("gpu0",), instances=2)
    two = BackendSpec(name="news@2", gpus=("gpu0",), instances=2, instance_of="news")
    h = Harness([one, two], devices=(gpu("gpu0"), host()), profiles={"news": (14, 2, LOAD_S)})
    warm(h, 300.0)
    h.arrive("r2", "news", at=400.0)
    out = h.arrive("r3", "news", at=401.0)
    assert not of(StartBackend, out) and not of(StopBackend, out)
    [flag] = [f for f in of(Flag, out) if f.request_id == "r3"]
    assert flag.backend == "news"
    assert "not news@2 (does not fit beside the instances loaded)" in flag.reason


def test_a_request_naming_a_further_instance_stays_there() -> None:
    h = two_gpus()
    [start] = of(StartBackend, h.arrive("r1", "news@2"))
    assert start.backend == "news@2"


def test_one_instance_backends_log_no_routing() -> None:
    solo = BackendSpec(name="solo", gpus=("gpu0",))
    h = Harness([solo], profiles={"solo": (4, 1, 5.0)})
    h.arrive("r1", "solo")
    h.ready("solo", at=5.0)
    h.arrive("r2", "solo", at=6.0)
    assert not [f for _, f in h.log if isinstance(f, Flag) and "bound to" in f.reason]


def test_a_request_bound_to_a_loading_second_instance_stays_there() -> None:
    h = two_gpus()
    warm(h, 90.0)
    h.arrive("r2", "news", at=200.0)  # runs on news until 260 s
    [start2] = of(StartBackend, h.arrive("r3", "news", at=201.0))
    assert start2.backend == "news@2"  # loading until 241 s
    assert not of(Dispatch, h.finish("r2", at=220.0))  # its load is under way: r3 stays
    [d] = of(Dispatch, h.ready("news@2", at=241.0))
    assert (d.request_id, d.backend) == ("r3", "news@2")


MUSIC = BackendSpec(name="music", gpus=("gpu1",))


def test_a_request_waiting_for_room_for_a_second_instance_moves_to_a_freed_first() -> None:
    h = Harness(
        [NEWS, NEWS_2, MUSIC],
        devices=(gpu("gpu0"), gpu("gpu1"), host()),
        profiles={"news": (14, 2, LOAD_S), "music": (12, 2, 30.0)},
    )
    warm(h, 90.0)  # news on gpu0
    assert of(StartBackend, h.arrive("m1", "music", at=150.0))
    assert of(Dispatch, h.ready("music", at=180.0))  # m1 holds gpu1
    h.arrive("r2", "news", at=200.0)  # runs on news until 290 s
    out = h.arrive("r3", "news", at=201.0)
    # news@2 would start once music's m1 ends (about 10 s, the default), plus
    # its 40 s load: sooner than news's 89 s. music drains for it.
    assert not of(StartBackend, out)
    assert h.s.explain("r3", h.now).backend == "news@2"  # type: ignore[union-attr]
    out = h.finish("r2", at=220.0)  # news frees first: r3 moves there
    [d] = of(Dispatch, out)
    assert (d.request_id, d.backend) == ("r3", "news")
    [flag] = [f for f in of(Flag, out) if f.request_id == "r3"]
    assert flag.reason == "r3: moved from news@2 (stopped) to news, ready with a free slot"
    # Nothing waits for news@2 any more: music is not stopped for it.
    assert not of(StopBackend, h.finish("m1", at=400.0))
    assert not [d for _, d in h.log if isinstance(d, StartBackend) and d.backend == "news@2"]


def test_a_moved_request_keeps_its_deadline() -> None:
    h = Harness(
        [NEWS, NEWS_2, MUSIC],
        devices=(gpu("gpu0"), gpu("gpu1"), host()),
        profiles={"news": (14, 2, LOAD_S), "music": (12, 2, 30.0)},
    )
    warm(h, 90.0)
    h.arrive("m1", "music", at=150.0)
    h.ready("music", at=180.0)
    h.arrive("r2", "news", at=200.0)
    h.arrive("r3", "news", at=201.0, start_by=300.0)  # to news@2, waiting for room
    h.arrive("r4", "news@2", at=202.0, start_by=400.0)  # named: news@2's queue: r3, r4
    [d] = of(Dispatch, h.finish("r2", at=220.0))
    assert d.request_id == "r3"  # the best-ranked moves, as many as slots free
    assert h.s.explain("r4", h.now).backend == "news@2"  # type: ignore[union-attr]
    # r3 started in time on news; its deadline timer of news@2's queue is stale.
    h.tick(301.0)
    assert not [d for _, d in h.log if getattr(d, "code", None) == "deadline_missed"]


def test_a_request_on_a_second_instance_is_explained_and_cancelled_there() -> None:
    h = two_gpus()
    warm(h, 90.0)
    h.arrive("r2", "news", at=200.0)
    h.arrive("r3", "news", at=201.0)  # bound to news@2, loading
    view = h.s.explain("r3", h.now)
    assert view is not None and view.backend == "news@2"
    assert "news@2" in view.reason
    h.cancel("r3", at=210.0)
    assert h.s.explain("r3", h.now) is None
    # news@2 loads on for nobody; once ready it idles, and r4 can still use it.
    assert not of(Dispatch, h.ready("news@2", at=241.0))
    [d] = of(Dispatch, h.arrive("r4", "news", at=242.0))
    assert d.backend == "news@2"  # news is busy with r2 until 290 s


# -- the load penalty, configured ---------------------------------------------------------


def _busy_first(config: SchedulerConfig | None = None, penalty: float | None = None) -> Harness:
    """news serves r2 at 200 s with 45 s service times learned; r3 comes at 201 s:
    44 s behind news, or 40 s of load on news@2 (counted 50 s at a quarter)."""
    specs = [replace(s, instance_load_penalty=penalty) for s in (NEWS, NEWS_2)]
    h = Harness(
        specs,
        devices=(gpu("gpu0"), gpu("gpu1"), host()),
        config=config,
        profiles={"news": (14, 2, LOAD_S)},
    )
    warm(h, 45.0)
    [d] = of(Dispatch, h.arrive("r2", "news", at=200.0))
    assert d.backend == "news"
    return h


def test_by_default_a_load_that_saves_less_than_a_quarter_of_itself_is_not_made() -> None:
    h = _busy_first()
    out = h.arrive("r3", "news", at=201.0)
    assert not of(StartBackend, out)
    [flag] = [f for f in of(Flag, out) if f.request_id == "r3"]
    assert flag.backend == "news"
    assert "news@2 not loaded, starts in about 40.0 s, 0 waiting, counted as 50.0 s" in flag.reason


@pytest.mark.parametrize(
    ("global_", "per_backend", "loads"),
    [(0.0, None, True), (0.25, 0.0, True), (0.0, 0.25, False), (0.1, None, False)],
)
def test_the_load_penalty_is_configured_globally_and_per_backend(
    global_: float, per_backend: float | None, loads: bool
) -> None:
    h = _busy_first(SchedulerConfig(instance_load_penalty=global_), per_backend)
    out = h.arrive("r3", "news", at=201.0)
    assert [s.backend for s in of(StartBackend, out)] == (["news@2"] if loads else [])
    penalty = global_ if per_backend is None else per_backend
    [flag] = [f for f in of(Flag, out) if f.request_id == "r3"]
    assert f"counted as {40.0 * (1 + penalty):.1f} s for the load" in flag.reason


@pytest.mark.parametrize("penalty", [-0.1, 4.5, float("nan"), float("inf")])
def test_a_load_penalty_outside_0_to_4_is_refused(penalty: float) -> None:
    with pytest.raises(ValueError, match="instance_load_penalty must be between 0 and 4"):
        SchedulerConfig(instance_load_penalty=penalty)
    with pytest.raises(ValueError, match="instance_load_penalty must be between 0 and 4"):
        replace(NEWS, instance_load_penalty=penalty)
