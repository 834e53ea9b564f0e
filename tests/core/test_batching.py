"""Swap-aware batching: loaded work may go ahead of a swap, a bounded number of times."""

from __future__ import annotations

from tests.core.harness import Harness, gpu, host
from yard.core import BackendSpec, Dispatch, SchedulerConfig, StartBackend, StopBackend


def swap_pending(batch_bound: int = 4) -> Harness:
    """chat (1 slot) is serving r0; big needs chat's memory; six small chat jobs wait."""
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",)), BackendSpec(name="big", gpus=("gpu0",))],
        config=SchedulerConfig(batch_bound=batch_bound),
        profiles={"chat": (10, 1, 5), "big": (16, 1, 20)},
    )
    h.load("chat", "r0")
    h.arrive("swap", "big", priority=50, at=1)
    for i in range(1, 7):
        h.arrive(f"c{i}", "chat", priority=10, at=1 + i / 10)
    return h


def finish_chat_jobs(h: Harness, start: float) -> None:
    t = start
    while (last := h.dispatched()[-1]).startswith(("r0", "c")) and h.state("chat") != "stopping":
        h.finish(last, at=t)
        t += 1
        if h.dispatched()[-1] == last:
            break


def test_loaded_work_overtakes_a_waiting_swap_at_most_batch_bound_times() -> None:
    h = swap_pending(batch_bound=4)
    finish_chat_jobs(h, start=2)
    assert h.dispatched() == ["r0", "c1", "c2", "c3", "c4"]
    assert h.stops() == ["chat"]
    [start] = h.stopped("chat", at=20)
    assert isinstance(start, StartBackend) and start.backend == "big"


def test_overtakes_are_counted_in_the_dispatch_reasons() -> None:
    h = swap_pending(batch_bound=2)
    finish_chat_jobs(h, start=2)
    reasons = [d.reason for d in h.decisions(Dispatch)[1:]]
    assert ["overtake 1 of 2" in reasons[0], "overtake 2 of 2" in reasons[1]] == [True, True]


def test_a_request_held_back_by_the_swap_says_so() -> None:
    h = swap_pending(batch_bound=1)
    finish_chat_jobs(h, start=2)
    view = h.s.explain("c2", h.now)
    assert view is not None
    assert view.reason.startswith("waiting: chat is stopping (making room for big (gpu0: big")


def test_batching_off_drains_the_victim_at_once() -> None:
    h = swap_pending(batch_bound=0)
    assert h.state("chat") == "draining"
    [stop] = h.finish("r0", at=2)
    assert isinstance(stop, StopBackend)
    assert h.dispatched() == ["r0"]


def test_a_drained_backend_is_ready_again_when_the_swap_is_no_longer_needed() -> None:
    h = swap_pending(batch_bound=0)
    h.cancel("swap", at=2)
    assert h.state("chat") == "ready"
    h.finish("r0", at=3)
    assert h.dispatched() == ["r0", "c1"]


def test_work_for_backends_the_swap_does_not_touch_is_not_limited() -> None:
    h = Harness(
        [
            BackendSpec(name="chat", gpus=("gpu0",)),
            BackendSpec(name="big", gpus=("gpu0",)),
            BackendSpec(name="other", gpus=("gpu1",)),
        ],
        devices=(gpu("gpu0"), gpu("gpu1"), host()),
        config=SchedulerConfig(batch_bound=0),
        profiles={"chat": (10, 1, 5), "big": (16, 1, 20), "other": (1, 1, 1)},
    )
    h.load("chat", "r0")
    h.load("other", "o0")
    h.arrive("swap", "big", priority=90, at=1)
    for i in range(1, 4):
        h.arrive(f"o{i}", "other", priority=1, at=1 + i)
        h.finish(f"o{i - 1}", at=1 + i)
    assert h.dispatched() == ["r0", "o0", "o1", "o2", "o3"]


def test_no_overtakes_while_the_swap_waits_for_an_urgent_deadline() -> None:
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",)), BackendSpec(name="big", gpus=("gpu0",))],
        config=SchedulerConfig(batch_bound=4, urgency_window_s=60),
        profiles={"chat": (10, 1, 5), "big": (16, 1, 20)},
    )
    h.load("chat", "r0")
    h.arrive("announce", "big", priority=50, at=1, start_by=60.0)  # urgent at once
    h.arrive("c1", "chat", priority=10, at=2)
    [stop] = h.finish("r0", at=3)
    assert isinstance(stop, StopBackend) and stop.backend == "chat"
    assert h.dispatched() == ["r0"]


def test_a_backend_loaded_for_waiting_work_serves_one_request_before_it_makes_room() -> None:
    h = Harness(
        [
            BackendSpec(name="chat", gpus=("gpu0",), slots=2),
            BackendSpec(name="big", gpus=("gpu0",)),
        ],
        config=SchedulerConfig(batch_bound=4, urgency_window_s=60),
        profiles={"chat": (10, 1, 5), "big": (16, 1, 20)},
    )
    h.arrive("c1", "chat", priority=10)
    h.arrive("c2", "chat", priority=10)
    h.arrive("announce", "big", priority=50, at=1, start_by=60.0)  # urgent, chat is loading
    h.ready("chat", at=5)
    assert h.dispatched() == ["c1"]  # its load is not wasted, but only one goes, not two
    [stop] = h.finish("c1", at=6)
    assert isinstance(stop, StopBackend) and stop.backend == "chat"


def chat_then_news(news_start_by: float) -> Harness:
    """chat (1 slot) served one 600 s request and five 10 s ones (mean ~110 s,
    longest 600 s); more chat jobs wait; at 645 a deadline request arrives for
    big (loads in 20 s), which needs chat's memory."""
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",)), BackendSpec(name="big", gpus=("gpu0",))],
        config=SchedulerConfig(batch_bound=4, urgency_window_s=0),
        profiles={"chat": (10, 1, 5), "big": (16, 1, 20)},
    )
    h.load("chat", "r0")
    for i in range(1, 10):
        h.arrive(f"c{i}", "chat", priority=10, at=599)
    h.finish("r0", at=600)
    for i in range(1, 5):
        h.finish(f"c{i}", at=600 + 10 * i)
    h.arrive("news", "big", priority=90, at=645, start_by=news_start_by)
    return h


def test_a_request_that_could_outlast_a_swaps_latest_start_does_not_overtake_it() -> None:
    # Latest start of the swap: 945 - 20 s load = 925; a chat request may take
    # 600 s (the longest recent one), so one dispatched at 650 could end at 1250.
    h = chat_then_news(news_start_by=945)
    [stop] = h.finish("c5", at=650)
    assert isinstance(stop, StopBackend) and stop.backend == "chat"
    assert h.dispatched()[-1] == "c5"
    [start] = h.stopped("chat", at=651)
    assert isinstance(start, StartBackend) and start.backend == "big"
    h.ready("big", at=671)
    assert h.dispatched()[-1] == "news"


def test_a_request_that_ends_before_a_swaps_latest_start_still_overtakes_it() -> None:
    h = chat_then_news(news_start_by=650 + 600 + 20 + 10)
    out = h.finish("c5", at=650)
    assert [d.request_id for d in out if isinstance(d, Dispatch)] == ["c6"]
    assert "overtake 1 of 4" in h.decisions(Dispatch)[-1].reason
    assert h.state("chat") == "ready"


def test_a_deadline_behind_the_head_of_a_swap_also_stops_overtakes() -> None:
    h = chat_then_news(news_start_by=945)
    h.cancel("news", at=646)
    h.arrive("vip", "big", priority=95, at=647)  # the swap's head, no deadline
    h.arrive("news2", "big", priority=90, at=648, start_by=945)
    [stop] = h.finish("c5", at=650)
    assert isinstance(stop, StopBackend) and stop.backend == "chat"
    assert h.dispatched()[-1] == "c5"
