"""First loads: alone only where the meter cannot tell a backend's memory apart."""

from __future__ import annotations

from dataclasses import replace

from tests.core.harness import GIB, Harness, gpu, host, of
from yard.core import BackendSpec, Flag, ProfileMeasured, StartBackend, StopBackend


def per_process(**kw: object) -> Harness:
    """gpu0 (24 GiB) and host metered per process: known (2 GiB) and new share gpu0."""
    return Harness(
        [BackendSpec(name="known", gpus=("gpu0",)), BackendSpec(name="new", gpus=("gpu0",))],
        devices=(replace(gpu(), per_process=True), replace(host(), per_process=True)),
        profiles={"known": (2, 1, 1)},
        **kw,  # type: ignore[arg-type]
    )


def test_a_first_load_goes_next_to_the_others_where_memory_is_attributed_per_process() -> None:
    h = per_process()
    h.load("known", "r1")
    h.finish("r1", at=1)
    [start] = h.arrive("r2", "new", at=2)
    assert isinstance(start, StartBackend) and start.backend == "new" and start.measure
    assert "measured next to the others" in start.reason
    assert h.stops() == []


def test_three_first_host_loads_stop_nothing_while_memory_is_free() -> None:
    h = Harness(
        [BackendSpec(name=n) for n in ("llm", "tts", "images")],
        devices=(replace(host(16), per_process=True),),
    )
    h.load("llm", "r1")
    h.finish("r1", at=1)
    h.load("tts", "r2", at=2)
    h.finish("r2", at=3)
    h.arrive("r3", "images", at=4)
    assert h.started() == ["llm", "tts", "images"]
    assert h.stops() == []
    assert {h.state(n) for n in ("llm", "tts")} == {"ready"}


def test_loads_stay_one_at_a_time_next_to_a_first_load() -> None:
    h = per_process()
    h.arrive("r1", "new")
    assert h.arrive("r2", "known", at=1) == []
    view = h.s.explain("r2", 1)
    assert view is not None and "new is loading there" in view.reason
    # Ready: its live use is what it holds; no need to wait for the profile.
    h.memory("gpu0", used_gib=5, at=2, new=5)
    [start] = of(StartBackend, h.ready("new", at=2))
    assert start.backend == "known"


def test_a_first_load_that_ran_out_of_memory_next_to_others_loads_alone_next_time() -> None:
    h = per_process()
    h.load("known", "r1")
    h.finish("r1", at=1)
    h.arrive("r2", "new", at=2)
    [flag, stop] = h.start_failed("new", at=3, oom=True)
    assert isinstance(flag, Flag) and "next start is as placed, alone" in flag.reason
    assert isinstance(stop, StopBackend) and stop.backend == "known"
    assert "loads alone to be measured" in stop.reason
    [start] = h.stopped("known", at=4)
    assert isinstance(start, StartBackend) and start.backend == "new"
    assert "measured alone" in start.reason


def test_device_deltas_still_measure_a_first_load_alone() -> None:
    h = Harness(
        [BackendSpec(name="known", gpus=("gpu0",)), BackendSpec(name="new", gpus=("gpu0",))],
        devices=(gpu(), replace(host(), per_process=True)),
        profiles={"known": (2, 1, 1)},
    )
    h.load("known", "r1")
    h.finish("r1", at=1)
    [stop] = h.arrive("r2", "new", at=2)
    assert isinstance(stop, StopBackend) and stop.backend == "known"
    [start] = h.stopped("known", at=3)
    assert isinstance(start, StartBackend) and "measured alone" in start.reason
    h.feed(ProfileMeasured(backend="new", gpu_bytes=5 * GIB, host_bytes=GIB, load_s=3), at=4)
