"""Optional resources: each start gets the largest context that fits, down to the minimum."""

from __future__ import annotations

from dataclasses import replace

from tests.core.harness import GIB, Harness, host, of
from yard.core import BackendSpec, Flag, ProfileMeasured, SchedulerConfig, StartBackend, StopBackend
from yard.core.resources import STEP

KIB = 1024
SPAN = (4096, 32768)
PER_TOKEN = 256 * KIB  # at 32768 tokens: 2 GiB + 7 GiB


def harness() -> Harness:
    """llm (2 GiB at 4096 tokens, 256 KiB per token) and other (8 GiB) on 16 GiB of host."""
    h = Harness(
        [BackendSpec(name="llm", context=SPAN), BackendSpec(name="other")],
        devices=(replace(host(16), per_process=True),),
        config=SchedulerConfig(profile_margin=1.0),
        profiles={"other": (0, 8, 5)},
    )
    return h


def measured(context: int, host_bytes: int, per_token: float | None = None) -> ProfileMeasured:
    return ProfileMeasured(
        backend="llm",
        gpu_bytes=0,
        host_bytes=host_bytes,
        load_s=3,
        context=context,
        host_per_token=per_token,
        gpu_per_token=None if per_token is None else 0.0,
    )


def learned(h: Harness) -> None:
    h.feed(measured(4096, 2 * GIB, PER_TOKEN))


def test_alone_it_gets_its_maximum() -> None:
    h = harness()
    learned(h)
    [start] = h.arrive("r1", "llm")
    assert isinstance(start, StartBackend) and start.context == 32768
    assert "context 32768 (of 4096-32768): its maximum fits" in start.reason


def test_next_to_others_it_gets_the_largest_that_fits_in_steps() -> None:
    h = harness()
    learned(h)
    h.load("other", "r0")
    [start] = h.arrive("r1", "llm", at=1)
    assert isinstance(start, StartBackend)
    # 8 GiB free: 2 GiB + (c - 4096) x 256 KiB <= 8 GiB -> c <= 28672
    assert start.context == 28672 and start.context % STEP == 0
    assert "the largest that fits next to the others" in start.reason
    assert h.stops() == []
    view = next(b for b in h.s.snapshot(1).backends if b.name == "llm")
    assert view.context == 28672


def test_room_is_made_only_for_the_minimum() -> None:
    h = harness()
    learned(h)
    h.load("other", "r0")
    h.feed(ProfileMeasured(backend="other", gpu_bytes=0, host_bytes=13 * GIB, load_s=5), at=1)
    [start] = h.arrive("r1", "llm", at=2)  # 3 GiB free: 2 GiB needed at 4096
    assert isinstance(start, StartBackend) and start.context == 8192
    assert h.stops() == []


def test_when_not_even_the_minimum_fits_room_is_made_for_it() -> None:
    h = harness()
    learned(h)
    h.load("other", "r0")
    h.feed(ProfileMeasured(backend="other", gpu_bytes=0, host_bytes=15 * GIB, load_s=5), at=1)
    h.finish("r0", at=2)
    [stop] = h.arrive("r1", "llm", at=3)  # 1 GiB free, 2 GiB needed at 4096
    assert isinstance(stop, StopBackend) and stop.backend == "other"
    [start] = h.stopped("other", at=4)
    assert isinstance(start, StartBackend) and start.context == 32768


def test_a_first_load_is_measured_at_the_maximum() -> None:
    h = harness()
    [start] = h.arrive("r1", "llm")
    assert isinstance(start, StartBackend) and start.measure and start.context == 32768
    assert "its maximum, measured on this first load" in start.reason


def test_one_point_starts_at_that_point_and_a_second_teaches_the_slope() -> None:
    h = harness()
    h.feed(measured(8192, 3 * GIB))
    [start] = h.arrive("r1", "llm")
    assert isinstance(start, StartBackend) and start.context == 8192
    assert "the one measured so far" in start.reason
    h.feed(measured(16384, 5 * GIB), at=1)  # +2 GiB for 8192 tokens: 256 KiB each
    profile = h.s.profile("llm")
    assert profile is not None and profile.host_per_token == PER_TOKEN
    h2 = harness()
    h2.feed(measured(8192, 3 * GIB))
    h2.feed(measured(16384, 5 * GIB))
    h2.load("other", "r0")
    [start] = of(StartBackend, h2.arrive("r2", "llm", at=1))
    # 8 GiB free: 5 GiB + (c - 16384) x 256 KiB <= 8 GiB -> c <= 28672
    assert start.context == 28672


def test_a_backend_without_a_range_has_no_context() -> None:
    h = harness()
    [start] = h.arrive("r1", "other")
    assert isinstance(start, StartBackend) and start.context is None


def test_live_use_is_weighed_against_the_profile_at_the_running_context() -> None:
    h = harness()
    learned(h)
    h.load("other", "r0")
    h.arrive("r1", "llm", at=1)  # starts at 28672: 8 GiB by the line
    h.ready("llm", at=2)
    assert h.memory("host", used_gib=16, at=3, other=8, llm=8) == []
    flags = of(Flag, h.memory("host", used_gib=16.5, at=4, other=8, llm=8.5))
    assert any("above its profile 8.0 GiB" in flag.reason for flag in flags)
