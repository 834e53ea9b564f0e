"""First contact: a model never measured, on a device something else already uses.

The backend is placed by the prior read from its model file
(:class:`yard.core.Prior`) until its first load measures it; a start that runs
out of memory where yard chose the place or the context steps down.
"""

from __future__ import annotations

from dataclasses import replace

from tests.core.harness import GIB, Harness, gpu, host, of
from yard.core import (
    BackendReady,
    BackendSpec,
    Flag,
    Prior,
    Profile,
    ProfileMeasured,
    ProfileRaised,
    Reject,
    StartBackend,
    StopBackend,
)

KIB = 1024
PER_TOKEN = 44 * KIB  # a 16-layer model, 11 KV heads of 64, f16 cache


def llm_prior(weights_gib: float = 0.25, trained: int | None = 131072, gpu: bool = False) -> Prior:
    at = int(weights_gib * GIB) + 4096 * PER_TOKEN
    figures = Profile(
        gpu_bytes=at if gpu else 0,
        host_bytes=0 if gpu else at,
        load_s=0.0,
        context=4096,
        gpu_per_token=PER_TOKEN if gpu else 0.0,
        host_per_token=0.0 if gpu else PER_TOKEN,
    )
    return Prior(profile=figures, trained_context=trained)


def busy_host(prior: Prior | None = None, context: tuple[int, int] = (4096, 131072)) -> Harness:
    """16 GiB of host, 13.5 GiB of it used by other processes: 2.5 GiB free."""
    spec = BackendSpec(name="llm", context=context, prior=prior or llm_prior())
    h = Harness([spec], devices=(replace(host(16), per_process=True),))
    h.memory("host", used_gib=13.5)
    return h


def test_a_first_load_starts_at_the_largest_context_its_prior_fits_next_to_foreign_memory() -> None:
    h = busy_host()
    [start] = h.arrive("r1", "llm", at=1)
    assert isinstance(start, StartBackend) and start.measure
    assert start.context is not None
    # 2.5 GiB free, 0.25 GiB of weights, 44 KiB a token, margin 1.1
    fits = (2.5 * GIB / 1.1 - 0.25 * GIB) / PER_TOKEN
    assert fits - 256 < start.context <= fits
    assert start.context < 131072
    assert "estimated from the model file" in start.reason
    assert "the largest that fits" in start.reason


def test_a_start_that_ran_out_of_memory_at_a_chosen_context_steps_down_to_the_minimum() -> None:
    h = busy_host()
    [first] = h.arrive("r1", "llm", at=1)
    assert isinstance(first, StartBackend)
    out = h.start_failed("llm", at=2, oom=True, detail="failed to allocate the KV cache")
    [flag] = of(Flag, out)
    assert "yard's doing" in flag.reason and f"yard chose context {first.context:,}" in flag.reason
    assert of(Reject, out) == []  # the request keeps its place
    [again] = of(StartBackend, out)
    assert again.context == 4096
    assert "its minimum, since a larger start ran out of memory" in again.reason


def test_where_even_the_minimum_alone_runs_out_the_requests_get_does_not_fit_with_figures() -> None:
    h = busy_host()
    h.arrive("r1", "llm", at=1)
    h.arrive("r2", "llm", at=1)
    h.start_failed("llm", at=2, oom=True)
    out = h.start_failed("llm", at=3, oom=True, detail="exit code 1")
    rejects = of(Reject, out)
    assert sorted(r.request_id for r in rejects) == ["r1", "r2"]
    assert {r.status for r in rejects} == {503}
    assert {r.code for r in rejects} == {"does_not_fit"}
    text = rejects[0].message
    assert "at context 4,096, alone" in text
    assert "16.0 GiB usable, 13.5 GiB held by other processes" in text
    assert "estimated from the model file" in text
    assert of(StartBackend, out) == []  # never the same failing start again


def test_a_start_already_at_its_minimum_does_not_repeat_it() -> None:
    # Only the minimum fits: the ladder's "minimum" step would repeat it.
    h = busy_host(prior=llm_prior(weights_gib=2.095))
    [start] = h.arrive("r1", "llm", at=1)
    assert isinstance(start, StartBackend) and start.context == 4096
    out = h.start_failed("llm", at=2, oom=True)
    assert [r.code for r in of(Reject, out)] == ["does_not_fit"]


def test_a_prior_that_cannot_fit_an_empty_machine_is_refused_at_once() -> None:
    spec = BackendSpec(name="big", gpus=("gpu0",), prior=llm_prior(60, gpu=True))
    h = Harness([spec], devices=(replace(gpu(gib=48), per_process=True), host()))
    [reject] = h.arrive("r1", "big", at=1)
    assert isinstance(reject, Reject) and reject.code == "does_not_fit"
    assert "estimated from the model file" in reject.message


def test_a_never_measured_model_makes_room_first_next_to_foreign_memory() -> None:
    """140 GiB, 100 GiB held by another process, a 30 GiB idle neighbour: the
    new 30 GiB model stops the neighbour first (no crash on the way)."""
    new = BackendSpec(name="new", gpus=("gpu0",), prior=llm_prior(30, trained=None, gpu=True))
    h = Harness(
        [BackendSpec(name="old", gpus=("gpu0",)), new],
        devices=(replace(gpu(gib=140), per_process=True), replace(host(), per_process=True)),
        profiles={"old": (30, 1, 5)},
    )
    h.load("old", "r1")
    h.finish("r1", at=1)
    h.memory("gpu0", used_gib=130, at=2, old=30)
    [stop] = h.arrive("r2", "new", at=3)
    assert isinstance(stop, StopBackend) and stop.backend == "old"
    [start] = h.stopped("old", at=4)
    assert isinstance(start, StartBackend) and start.backend == "new"
    assert "estimated from the model file" in start.reason


def test_a_prior_that_fits_loads_next_to_the_others() -> None:
    new = BackendSpec(name="new", gpus=("gpu0",), prior=llm_prior(5, trained=None, gpu=True))
    h = Harness(
        [BackendSpec(name="old", gpus=("gpu0",)), new],
        devices=(replace(gpu(gib=140), per_process=True), replace(host(), per_process=True)),
        profiles={"old": (30, 1, 5)},
    )
    h.load("old", "r1")
    h.finish("r1", at=1)
    h.memory("gpu0", used_gib=130, at=2, old=30)
    [start] = h.arrive("r2", "new", at=3)
    assert isinstance(start, StartBackend) and "measured next to the others" in start.reason
    assert h.stops() == []


def test_a_context_above_the_trained_one_is_not_offered() -> None:
    spec = BackendSpec(name="llm", context=(512, 4096), prior=llm_prior(0.01, trained=2048))
    h = Harness([spec], devices=(replace(host(16), per_process=True),))
    [start] = h.arrive("r1", "llm", at=1)
    assert isinstance(start, StartBackend) and start.context == 2048
    assert "not above 2,048 tokens, the context the model was trained for" in start.reason


def test_what_the_server_took_is_what_yard_reports() -> None:
    spec = BackendSpec(name="llm", context=(512, 4096), slots=2)
    h = Harness([spec], devices=(replace(host(16), per_process=True),))
    [start] = h.arrive("r1", "llm", at=1)
    assert isinstance(start, StartBackend) and start.context == 4096
    out = h.feed(BackendReady(backend="llm", context=2048, slots=4), at=2)
    [flag] = of(Flag, out)
    assert "the server took context 2,048 (yard chose 4,096)" in flag.reason
    assert "4 slots" in flag.reason
    (view,) = [b for b in h.s.snapshot(2).backends if b.name == "llm"]
    assert view.context == 2048 and view.slots == 4


def test_a_measured_profile_replaces_the_prior() -> None:
    h = busy_host()
    [start] = h.arrive("r1", "llm", at=1)
    assert isinstance(start, StartBackend)
    (view,) = h.s.snapshot(1).backends
    assert view.prior is not None
    h.ready("llm", at=2)
    h.finish("r1", at=3)
    h.feed(
        ProfileMeasured(
            backend="llm", gpu_bytes=0, host_bytes=GIB, load_s=1, context=start.context
        ),
        at=4,
    )
    (view,) = h.s.snapshot(4).backends
    assert view.prior is None and view.profile is not None


def test_a_profile_is_raised_only_for_a_meaningful_step() -> None:
    """At least 2 % and 32 MiB above it: a host creeping by megabytes is not."""
    h = Harness([BackendSpec(name="llm")], profiles={"llm": (0, 0.6, 1)})
    h.load("llm", "r1")
    creep = 0.6 + 30 / 1024  # 30 MiB above 0.6 GiB: under 32 MiB
    assert of(ProfileRaised, h.memory("host", used_gib=2, at=1, llm=creep)) == []
    assert of(Flag, [d for _, d in h.log]) == []
    [raised] = of(ProfileRaised, h.memory("host", used_gib=2, at=2, llm=0.7))
    assert raised.profile.host_bytes == int(0.7 * GIB)
    big = Harness([BackendSpec(name="big")], profiles={"big": (0, 10, 1)})
    big.load("big", "r1")
    # 100 MiB above 10 GiB is 1 %: not a step
    assert of(ProfileRaised, big.memory("host", used_gib=20, at=1, big=10 + 100 / 1024)) == []


def test_a_server_without_a_range_reports_its_context_without_a_flag() -> None:
    h = Harness([BackendSpec(name="llm")], devices=(replace(host(16), per_process=True),))
    h.arrive("r1", "llm", at=1)
    out = h.feed(BackendReady(backend="llm", context=8192, slots=1), at=2)
    assert of(Flag, out) == []
    (view,) = h.s.snapshot(2).backends
    assert view.context == 8192


def test_after_giving_up_new_requests_are_refused_until_memory_is_freed() -> None:
    h = busy_host()
    h.arrive("r1", "llm", at=1)
    h.start_failed("llm", at=2, oom=True)
    h.start_failed("llm", at=3, oom=True)  # alone at its minimum: gave up
    [again] = h.arrive("r2", "llm", at=4)
    assert isinstance(again, Reject) and again.code == "does_not_fit"
    assert of(StartBackend, [d for _, d in h.log][-1:]) == []
    h.memory("host", used_gib=10, at=5)  # the other processes freed 3.5 GiB
    [start] = h.arrive("r3", "llm", at=6)
    assert isinstance(start, StartBackend) and start.context is not None
    assert start.context > 4096  # the ladder starts over from the prior's fit
