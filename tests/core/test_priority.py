"""Priority with aging: who goes first on one backend."""

from __future__ import annotations

from tests.core.harness import Harness
from yard.core import BackendSpec, SchedulerConfig


def busy_chat(config: SchedulerConfig | None = None) -> Harness:
    """chat (1 slot) is loaded and serving r0."""
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",))], config=config, profiles={"chat": (4, 1, 5)}
    )
    h.load("chat", "r0")
    return h


def test_higher_priority_goes_first_on_a_busy_backend() -> None:
    h = busy_chat()
    h.arrive("low", "chat", priority=10, at=1)
    h.arrive("high", "chat", priority=90, at=2)
    h.finish("r0", at=3)
    assert h.dispatched() == ["r0", "high"]


def test_aging_lets_an_old_low_priority_request_pass_a_newer_high_one() -> None:
    h = busy_chat(SchedulerConfig(aging_rate=1.0))
    h.arrive("old", "chat", priority=10, at=1)  # effective at t: 10 + (t - 1)
    h.arrive("new", "chat", priority=50, at=42)  # 50 + (t - 42): old leads by 1
    h.finish("r0", at=50)
    assert h.dispatched() == ["r0", "old"]


def test_equal_effective_priority_goes_to_the_earlier_arrival_then_the_smaller_id() -> None:
    h = busy_chat(SchedulerConfig(aging_rate=1.0))
    h.arrive("b", "chat", priority=20, at=1)
    h.arrive("a", "chat", priority=21, at=2)  # same rank as b: b arrived first
    h.arrive("d", "chat", priority=30, at=3)
    h.arrive("c", "chat", priority=30, at=3)  # same rank and arrival: id decides
    for t in (10, 11, 12, 13, 14):
        h.finish(h.dispatched()[-1], at=t)
    assert h.dispatched() == ["r0", "c", "d", "b", "a"]


def test_priorities_are_clamped_to_the_configured_range() -> None:
    h = busy_chat(SchedulerConfig(min_priority=0, max_priority=100, aging_rate=1.0))
    h.arrive("patient", "chat", priority=0, at=1)
    h.arrive("greedy", "chat", priority=10_000, at=103)  # counts as 100: 2 behind patient
    view = h.s.explain("greedy", 103)
    assert view is not None and view.effective_priority == 100
    h.finish("r0", at=104)
    assert h.dispatched() == ["r0", "patient"]


def test_a_restored_request_keeps_aging_from_its_original_arrival() -> None:
    h = busy_chat(SchedulerConfig(aging_rate=1.0))
    h.arrive("fresh", "chat", priority=60, at=100)
    h.arrive("restored", "chat", priority=20, at=100, arrived_at=50.0)  # 20 + 50 of age
    h.finish("r0", at=101)
    assert h.dispatched() == ["r0", "restored"]
