"""Several instances of one backend: the routing function, and the core driven by events."""

from __future__ import annotations

import pytest

from tests.core.harness import GIB, Harness, gpu, host, of
from yard.core import BackendSpec, Dispatch, Flag, ProfileMeasured, StartBackend, StopBackend
from yard.core.instances import Option, choose, expected_wait

# -- the pure parts ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("load_left", "slots", "running", "queued", "expected"),
    [
        (0.0, 1, 0, 0, 0.0),  # loaded, a slot free
        (0.0, 2, 1, 0, 0.0),  # loaded, one of two slots free
        (0.0, 1, 1, 0, 90.0),  # loaded, busy: the running one ends first
        (0.0, 1, 1, 2, 270.0),  # busy, two waiting: three end before it starts
        (0.0, 2, 2, 1, 90.0),  # two slots busy, one waiting: (1 + 2 - 2 + 1) * 90 / 2
        (25.0, 1, 0, 0, 25.0),  # loading: the rest of its load
        (25.0, 1, 0, 1, 115.0),  # loading, one waiting: the load, then that one
        (40.0, 2, 0, 1, 40.0),  # not loaded, two slots, one waiting: a slot is left for it
    ],
)
def test_expected_wait(
    load_left: float, slots: int, running: int, queued: int, expected: float
) -> None:
    got = expected_wait(
        load_left_s=load_left, slots=slots, running=running, queued=queued, service_s=90.0
    )
    assert got == expected


def test_choose_takes_the_least_wait_and_the_first_on_a_tie() -> None:
    a, b, c = (Option(name=n, wait_s=w, how="") for n, w in (("a", 40.0), ("b", 40.0), ("c", 41)))
    assert choose([a, b, c]) is a
    assert choose([c, b, a]) is b
    assert choose([c]) is c


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
    assert "news ready, 1 of 1 slots busy, 0 waiting (about 90.0 s until a slot)" in flag.reason
    assert "news@2 not loaded, starts in about 40.0 s" in flag.reason
    [d3] = of(Dispatch, h.ready("news@2", at=241.0))
    assert (d3.request_id, d3.backend) == ("r3", "news@2")
    # Early binding: r4 finds both busy; the first frees at 290 s, before news@2.
    out = h.arrive("r4", "news", at=250.0)
    assert h.s.explain("r4", h.now).backend == "news"  # type: ignore[union-attr]
    [d4] = of(Dispatch, h.finish("r2", at=290.0))
    assert (d4.request_id, d4.backend) == ("r4", "news")


def test_a_request_waits_for_a_loading_second_instance_when_that_is_sooner() -> None:
    h = two_gpus()
    warm(h, 90.0)
    h.arrive("r2", "news", at=200.0)
    h.arrive("r3", "news", at=201.0)  # news@2 starts loading: ready at 241 s
    out = h.arrive("r4", "news", at=211.0)
    # news: r2 runs (90 s), then r3? No: r3 went to news@2. news has 1 + 0 ahead:
    # 90 s; news@2 has 30 s of load left and r3 ahead of it: 30 + 90 s.
    assert h.s.explain("r4", h.now).backend == "news"  # type: ignore[union-attr]
    assert not of(StartBackend, out)


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


def test_a_request_waiting_for_a_loading_second_instance_moves_to_a_freed_first() -> None:
    h = two_gpus()
    warm(h, 90.0)
    h.arrive("r2", "news", at=200.0)  # runs on news until 260 s
    [start2] = of(StartBackend, h.arrive("r3", "news", at=201.0))
    assert start2.backend == "news@2"  # loading until 241 s
    out = h.finish("r2", at=220.0)  # news frees before news@2 is ready
    [d] = of(Dispatch, out)
    assert (d.request_id, d.backend) == ("r3", "news")
    [flag] = [f for f in of(Flag, out) if f.request_id == "r3"]
    assert flag.reason == "r3: moved from news@2 (starting) to news, ready with a free slot"
    # news@2 loads on, idle; a ready news@2 takes no request from a ready news.
    assert not of(Dispatch, h.ready("news@2", at=241.0))


def test_a_moved_request_keeps_its_deadline() -> None:
    h = two_gpus()
    warm(h, 90.0)
    h.arrive("r2", "news", at=200.0)
    h.arrive("r3", "news", at=201.0, start_by=300.0)  # to news@2, ready at 241 s
    h.arrive("r4", "news@2", at=202.0, start_by=400.0)  # named: news@2's queue: r3, r4
    [d] = of(Dispatch, h.finish("r2", at=220.0))
    assert d.request_id == "r3"  # the best-ranked moves, as many as slots free
    assert h.s.explain("r4", h.now).backend == "news@2"  # type: ignore[union-attr]
    [d4] = of(Dispatch, h.ready("news@2", at=241.0))
    assert d4.request_id == "r4"
    # r3 started in time on news: its deadline timer of news@2's queue is stale.
    assert not [f for f in of(Flag, h.tick(301.0)) if f.request_id == "r3"]
    assert not [d for _, d in h.log if getattr(d, "code", None) == "deadline_missed"]
