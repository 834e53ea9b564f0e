"""Edges: bad construction, unknown names, duplicate reports, less travelled reasons."""

from __future__ import annotations

import pytest

from tests.core.harness import Harness, gpu, host, of
from yard.core import (
    AdminLoad,
    AdminPin,
    AdminUnload,
    BackendSpec,
    Event,
    Flag,
    ProfileMeasured,
    Reject,
    Scheduler,
    SchedulerConfig,
    StartBackend,
    StopBackend,
)


def chat(**kw: object) -> Harness:
    return Harness(
        [BackendSpec(name="chat", gpus=("gpu0",), **kw)],  # type: ignore[arg-type]
        profiles={"chat": (4, 1, 5)},
    )


def test_a_device_or_backend_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="device gpu0 is listed twice"):
        Scheduler([gpu(), gpu()], [])
    with pytest.raises(ValueError, match="backend a is listed twice"):
        Scheduler([gpu()], [BackendSpec(name="a"), BackendSpec(name="a")])


@pytest.mark.pure_core  # a compiled event class cannot be subclassed outside the core
def test_an_event_the_core_does_not_know_is_flagged_not_fatal() -> None:
    class Strange(Event):
        pass

    h = chat()
    [flag] = h.feed(Strange())
    assert isinstance(flag, Flag) and "does not know" in flag.reason


def test_a_second_arrival_with_the_same_id_is_ignored() -> None:
    h = chat()
    h.arrive("r1", "chat")
    [flag] = h.arrive("r1", "chat", at=1)
    assert isinstance(flag, Flag) and flag.request_id == "r1"
    assert h.s.queue_length() == 1


def test_a_backend_whose_gpus_are_absent_does_not_fit() -> None:
    h = Harness([BackendSpec(name="x", gpus=("gpu3",))], devices=(host(),))
    [reject] = h.arrive("r1", "x")
    assert isinstance(reject, Reject) and reject.code == "does_not_fit"
    assert "this machine has: none" in reject.message


def test_an_exit_while_starting_counts_as_a_failed_start() -> None:
    h = chat()
    h.arrive("r1", "chat")
    [reject] = h.exited("chat", at=1)
    assert isinstance(reject, Reject) and reject.code == "backend_failed"
    assert "failed to start: exit code 1" in reject.message


def test_admin_events_for_unknown_backends_are_flagged() -> None:
    h = chat()
    for event in (
        AdminLoad(backend="x"),
        AdminUnload(backend="x"),
        AdminPin(backend="x", pinned=True),
    ):
        [flag] = h.feed(event)
        assert isinstance(flag, Flag) and "no backend named 'x'" in flag.reason


def test_admin_unload_while_starting_stops_once_ready() -> None:
    h = chat()
    h.arrive("r1", "chat")
    h.feed(AdminUnload(backend="chat"), at=1)
    out = h.ready("chat", at=5)
    assert [type(d) for d in out] == [StopBackend]  # the waiting request stays queued


def test_pinning_an_admin_draining_backend_keeps_it() -> None:
    h = chat()
    h.load("chat", "r1")
    h.feed(AdminUnload(backend="chat"), at=1)
    h.feed(AdminPin(backend="chat", pinned=True), at=2)
    assert h.state("chat") == "ready"
    assert h.finish("r1", at=3) == []


def test_a_profile_for_an_unknown_backend_is_ignored() -> None:
    h = chat()
    assert h.feed(ProfileMeasured(backend="ghost", gpu_bytes=1, host_bytes=1)) == []


def test_the_wait_bound_uses_learned_load_times_and_is_unknown_before() -> None:
    h = Harness([BackendSpec(name="chat", gpus=("gpu0",))], devices=(gpu(), host()))
    assert h.s.wait_bound(max_service_s=1) is None  # never loaded, no profile
    h.arrive("r1", "chat")
    h.ready("chat", at=4)  # learned: loads in 4 s
    c = SchedulerConfig()
    t = (c.max_priority - c.min_priority + c.deadline_boost) / c.aging_rate
    assert h.s.wait_bound(max_service_s=1) == t + (c.queue_limit + c.batch_bound + 1) * (4 + 1)


def test_a_request_waiting_for_a_busy_slot_says_so() -> None:
    h = chat(slots=1)
    h.load("chat", "r1")
    h.arrive("r2", "chat", at=1)
    view = h.s.explain("r2", 1)
    assert view is not None and view.reason.startswith("waiting for a free slot on chat (1/1 busy")


def test_next_wakeup_is_none_when_nothing_is_pending() -> None:
    h = chat()
    assert h.s.next_wakeup() is None
    [start] = h.arrive("r1", "chat", start_by=100.0)
    assert isinstance(start, StartBackend)
    assert h.s.next_wakeup() is not None


def test_an_operators_load_while_another_loads_on_the_device_is_kept_until_it_can() -> None:
    # Before: flagged "not loading now" and dropped, though the load was 202.
    h = Harness(
        [
            BackendSpec(name="chat", gpus=("gpu0",)),
            BackendSpec(name="tts", gpus=("gpu0",)),
        ],
        profiles={"chat": (4, 1, 10), "tts": (4, 1, 10)},
    )
    assert of(StartBackend, h.arrive("r1", "chat", at=0))
    [flag] = h.feed(AdminLoad(backend="tts"), at=1)
    assert isinstance(flag, Flag) and "it loads once it can" in flag.reason
    assert h.state("tts") == "stopped"
    [start] = of(StartBackend, h.ready("chat", at=10))
    assert start.backend == "tts"
