"""Patient work: a request whose start-by is far off ages only from its latest
comfortable start, and meanwhile leaves slots to the work that keeps coming."""

from __future__ import annotations

import math

from tests.core.harness import Harness
from yard.core import BackendSpec, Flag, SchedulerConfig


def busy_chat(slots: int = 1, **cfg: float) -> Harness:
    """chat (loads in 5 s) is loaded and serving r0 since t=0."""
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",), slots=slots)],
        config=SchedulerConfig(default_service_s=10, **cfg),  # type: ignore[arg-type]
        profiles={"chat": (4, 1, 5)},
    )
    h.load("chat", "r0")
    return h


def test_a_line_due_in_three_hours_gives_way_to_a_fresher_chat_request() -> None:
    h = busy_chat()
    h.arrive("line", "chat", priority=20, at=1, start_by=3 * 3600.0)
    # Aged from its arrival, the line would rank 20 + 99 = 119 at t=100, above
    # any chat request of priority 50 that came after t=31.
    h.arrive("chat", "chat", priority=50, at=100)
    h.finish("r0", at=101)
    assert h.dispatched() == ["r0", "chat"]
    flags = [d.reason for d in h.decisions(Flag) if d.request_id == "line"]
    assert flags == [
        "line: its start-by is far off: it ages from its latest comfortable start, "
        "in 7199 s (3600 s before its start-by); until then fresher work of higher "
        "priority goes first"
    ]


def test_patient_work_ages_from_its_latest_comfortable_start() -> None:
    h = busy_chat()
    h.arrive("line", "chat", priority=20, at=1, start_by=4000.0)  # ages from 400
    h.arrive("early", "chat", priority=50, at=300)  # ranks 50 - 300 > 20 - 400
    h.arrive("late", "chat", priority=50, at=480)  # ranks 50 - 480 < 20 - 400
    h.finish("r0", at=500)
    h.finish("early", at=501)
    assert h.dispatched() == ["r0", "early", "line"]


def test_a_start_by_within_the_patience_ages_from_arrival_as_before() -> None:
    h = busy_chat()
    h.arrive("news", "chat", priority=20, at=1, start_by=3000.0)
    h.arrive("chat", "chat", priority=50, at=100)
    h.finish("r0", at=101)
    assert h.dispatched() == ["r0", "news"]
    assert not [d for d in h.decisions(Flag) if d.request_id == "news"]


def test_infinite_patience_turns_it_off() -> None:
    h = busy_chat(patient_aging_s=math.inf)
    h.arrive("line", "chat", priority=20, at=1, start_by=3 * 3600.0)
    h.arrive("chat", "chat", priority=50, at=100)
    h.finish("r0", at=101)
    assert h.dispatched() == ["r0", "line"]


def test_lines_due_at_the_same_time_keep_their_order() -> None:
    h = busy_chat()
    for n in range(3):
        h.arrive(f"l{n}", "chat", priority=20, at=1 + n, start_by=3 * 3600.0)
    for n, rid in enumerate(["r0", "l0", "l1"]):
        h.finish(rid, at=10 + n)
    assert h.dispatched() == ["r0", "l0", "l1", "l2"]


def test_patient_work_leaves_free_slots_to_the_work_that_keeps_coming() -> None:
    h = busy_chat(slots=4)  # r0, not patient, runs since t=0
    for n in range(6):
        h.arrive(f"l{n}", "chat", priority=20, at=1, start_by=3 * 3600.0)
    # one line: two slots stay free, one more than the other work running holds
    assert h.dispatched() == ["r0", "l0"]
    h.arrive("c1", "chat", priority=50, at=2)
    assert h.dispatched()[-1] == "c1"
    h.finish("r0", at=3)
    h.finish("c1", at=3)
    assert h.dispatched()[-2:] == ["l1", "l2"]  # nothing else runs: one slot is left
    # No other work for a minute: the lines may have every slot.
    h.finish("l0", at=100)
    assert h.dispatched()[-2:] == ["l3", "l4"]


def test_on_a_backend_of_one_slot_order_alone_decides() -> None:
    h = busy_chat(slots=1)
    h.arrive("line", "chat", priority=20, at=1, start_by=3 * 3600.0)
    h.finish("r0", at=2)
    assert h.dispatched() == ["r0", "line"]
