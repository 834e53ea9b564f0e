"""Start-by deadlines: urgency, infeasible deadlines, missed deadlines."""

from __future__ import annotations

from tests.core.harness import Harness, gpu, host
from yard.core import BackendSpec, Dispatch, Reject, SchedulerConfig
from yard.core.plans import Outcome


def busy_chat(**cfg: float) -> Harness:
    """chat (1 slot, loads in 5 s) is loaded and serving r0 since t=0."""
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",)), BackendSpec(name="big", gpus=("gpu0",))],
        config=SchedulerConfig(default_service_s=10, **cfg),  # type: ignore[arg-type]
        profiles={"chat": (4, 1, 5), "big": (16, 1, 20)},
    )
    h.load("chat", "r0")
    return h


def test_an_urgent_deadline_request_goes_ahead_of_higher_priority_work() -> None:
    h = busy_chat(urgency_window_s=30)
    h.arrive("vip", "chat", priority=100, at=1)
    h.arrive("announce", "chat", priority=0, at=2, start_by=40.0)  # urgent from 40-15-30
    h.finish("r0", at=3)
    assert h.dispatched() == ["r0", "announce"]


def test_a_deadline_far_away_does_not_jump_the_queue() -> None:
    h = busy_chat(urgency_window_s=30)
    h.arrive("vip", "chat", priority=100, at=1)
    h.arrive("later", "chat", priority=0, at=2, start_by=1000.0)
    h.finish("r0", at=3)
    assert h.dispatched() == ["r0", "vip"]


def test_a_request_becomes_urgent_at_its_wakeup() -> None:
    h = busy_chat(urgency_window_s=30)
    h.arrive("vip", "chat", priority=100, at=1)
    h.arrive("later", "chat", priority=0, at=2, start_by=100.0)
    # urgent at 100 - (5 s load + 10 s service) - 30 = 55
    assert h.s.next_wakeup() == 55
    h.tick(55)
    h.finish("r0", at=56)
    assert h.dispatched() == ["r0", "later"]


def test_urgent_requests_go_earliest_deadline_first() -> None:
    h = busy_chat(urgency_window_s=1000)
    h.arrive("late", "chat", priority=50, at=1, start_by=300.0)
    h.arrive("soon", "chat", priority=40, at=2, start_by=200.0)
    h.finish("r0", at=3)
    assert h.dispatched() == ["r0", "soon"]


def test_the_deadline_boost_is_bounded() -> None:
    h = busy_chat(urgency_window_s=1000, deadline_boost=20, aging_rate=1.0)
    h.arrive("old", "chat", priority=50, at=1)
    h.arrive("urgent", "chat", priority=10, at=30, start_by=500.0)  # rank 10-30+20 < 50-1
    h.finish("r0", at=31)
    assert h.dispatched() == ["r0", "old"]


def test_an_infeasible_deadline_is_refused_at_arrival_with_the_earliest_start() -> None:
    h = busy_chat()
    [reject] = h.arrive("r1", "big", at=1, start_by=10.0)  # big loads in 20 s
    assert isinstance(reject, Reject) and (reject.status, reject.code) == (
        409,
        "deadline_infeasible",
    )
    assert "earliest possible start is in" in reject.message


def test_an_infeasible_deadline_is_accepted_and_flagged_when_late_is_allowed() -> None:
    h = busy_chat()
    out = h.arrive("r1", "big", at=1, start_by=10.0, allow_late=True)
    assert not [d for d in out if isinstance(d, Reject)]
    assert any(f.request_id == "r1" and "late" in f.reason for f in h.flags())


def test_a_deadline_that_passes_in_the_queue_ends_the_request_with_504() -> None:
    h = busy_chat(urgency_window_s=0)
    h.arrive("r1", "chat", at=1, start_by=20.0)  # feasible: r0 should end in ~10 s
    [reject] = h.tick(20)
    assert isinstance(reject, Reject) and (reject.status, reject.code) == (504, "deadline_missed")
    assert "19.0 s in the queue" in reject.message


def test_a_passed_deadline_that_allows_late_keeps_the_request() -> None:
    h = busy_chat(urgency_window_s=0)
    h.arrive("r1", "chat", at=1, start_by=20.0, allow_late=True)
    h.tick(20)
    assert h.rejected() == {}
    h.finish("r0", at=25)
    assert h.dispatched() == ["r0", "r1"]


def test_the_wait_bound_follows_the_documented_formula() -> None:
    h = busy_chat(aging_rate=2.0, deadline_boost=50, min_priority=0, max_priority=100)
    c = h.s.config
    # loads: chat 5 s, big 20 s; longest service asked for: 7 s
    expected = (100 + 50) / 2.0 + (c.queue_limit + c.batch_bound + 1) * (20 + 7)
    assert h.s.wait_bound(max_service_s=7) == expected
    assert h.s.wait_bound() is None  # nothing served yet: no measured service time
    h.finish("r0", at=3)
    assert h.s.wait_bound() == (100 + 50) / 2.0 + (c.queue_limit + c.batch_bound + 1) * (20 + 3)


def test_a_stream_of_high_priority_work_cannot_starve_a_swap() -> None:
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",)), BackendSpec(name="big", gpus=("gpu0",))],
        config=SchedulerConfig(aging_rate=1.0, deadline_boost=0, batch_bound=2, queue_limit=50),
        profiles={"chat": (10, 1, 5), "big": (16, 1, 20)},
    )
    h.load("chat", "c0", priority=100)
    h.arrive("patient", "big", priority=0, at=0.5)
    t, n = 1.0, 0
    while "patient" not in h.dispatched() and t < 1000:
        n += 1
        h.arrive(f"c{n}", "chat", priority=100, at=t)
        if h.dispatched()[-1].startswith("c"):
            h.finish(h.dispatched()[-1], at=t + 0.5)
        if h.state("chat") == "stopping":
            h.stopped("chat", at=t + 0.6)
        if h.state("big") == "starting":
            h.ready("big", at=t + 0.7)
        t += 1.0
    waited = h.log[[d for _, d in h.log].index(h.decisions(Dispatch)[-1])][0] - 0.5
    bound = h.s.wait_bound(max_service_s=0.5)
    assert bound is not None and waited <= bound
    assert 90 <= waited <= 100 + 10  # aging alone overtakes priority 100 after 100 s


def idle_chat() -> Harness:
    """chat is loaded and idle since t=5 (its one slot is free)."""
    h = busy_chat()
    h.finish("r0", at=5)
    return h


def test_a_start_by_of_now_on_a_ready_backend_with_a_free_slot_is_dispatched_at_once() -> None:
    # X-Yard-Start-Within: 0 becomes an engine time a moment before the core
    # handles the arrival.
    h = idle_chat()
    out = h.arrive("now", "chat", at=10.01, start_by=10.0)
    assert [d.request_id for d in out if isinstance(d, Dispatch)] == ["now"]
    assert h.rejected() == {}
    h.tick(11)
    assert h.rejected() == {}


def test_a_start_by_equal_to_the_arrival_on_a_free_slot_is_dispatched_at_once() -> None:
    h = idle_chat()
    out = h.arrive("now", "chat", at=10, start_by=10.0)
    assert [d.request_id for d in out if isinstance(d, Dispatch)] == ["now"]


def test_a_start_by_clearly_in_the_past_is_still_refused() -> None:
    h = idle_chat()
    [reject] = h.arrive("old", "chat", at=10, start_by=9.0)
    assert isinstance(reject, Reject) and reject.code == "deadline_infeasible"
    assert "1.0 s after the requested start-by" in reject.message


def test_urgency_counts_the_longest_recent_service_of_a_neighbour_not_the_mean() -> None:
    h = busy_chat(urgency_window_s=0)
    h.finish("r0", at=100)  # chat's requests: 100 s, then 10 s ones (mean ~ 53 s)
    for i in range(1, 4):
        h.arrive(f"c{i}", "chat", at=100 + 10 * (i - 1))
        h.finish(f"c{i}", at=100 + 10 * i)
    h.arrive("announce", "big", at=200, start_by=400.0)
    # urgent at 400 - (20 s load + 100 s longest chat request) = 280
    assert h.s.next_wakeup() == 280


def test_urgency_counts_the_longest_service_of_the_other_backends_as_it_is_now() -> None:
    h = busy_chat(urgency_window_s=30)
    # chat has served nothing yet: its high estimate is the default, 10 s
    h.arrive("first", "big", priority=100, at=1, start_by=300.0)
    assert h.s.next_wakeup() == 300 - (20 + 10) - 30
    h.finish("r0", at=40)  # a 40 s service: chat's high estimate is 40 s now
    h.arrive("second", "big", priority=100, at=41, start_by=250.0)
    assert h.s.next_wakeup() == 250 - (20 + 40) - 30


def test_the_wait_for_room_in_the_earliest_start_is_the_best_plans() -> None:
    # Core.free_wait skips the plans' sentences: it must give what the plan gives
    h = Harness(  # an 18 GiB GPU: big (16 GiB) fits only once chat (4 GiB) stops
        [BackendSpec(name="chat", gpus=("gpu0",)), BackendSpec(name="big", gpus=("gpu0",))],
        devices=(gpu(gib=18), host()),
        config=SchedulerConfig(default_service_s=10),
        profiles={"chat": (4, 1, 5), "big": (16, 1, 20)},
    )
    h.load("chat", "r0")
    core, big = h.s._core, h.s._core.backends["big"]
    plan = core.best_plan(big, None, {}, set(), set(), 1.0)
    assert plan is not None and plan.status is Outcome.EVICT  # chat (busy) must finish
    assert core.free_wait(big, 1.0) == plan.free_wait_s == 10  # chat's service estimate
    h.finish("r0", at=2)
    h.arrive("r1", "big", at=3)  # big loads: chat stops, then big starts
    h.stopped("chat", at=4)
    assert h.state("big") == "starting"
    chat = core.backends["chat"]
    plan = core.best_plan(chat, None, {}, set(), set(), 5.0)
    assert plan is not None and plan.status is Outcome.WAIT  # one load at a time
    assert core.free_wait(chat, 5.0) == plan.free_wait_s == 0
