"""A swap's start-bys count the requests queued ahead of them on its slots.

Swap batching lets a request for a loaded backend go ahead of a waiting swap
only if it ends by the swap's latest start. Several deadline requests waiting
for a one-slot backend start one after another once it is ready, so the latest
start is the last one's start-by less its load and the services before it, not
the earliest start-by less the load. (The simulator's radio day, seed 5: two
five-minute music requests went ahead of news-llm's swap while three news
scripts waited for its one slot; the third missed its start-by by 4 s.)
"""

from __future__ import annotations

from tests.core.harness import Harness, gpu, host
from yard.core import BackendSpec, Dispatch, Reject, SchedulerConfig, StartBackend, StopBackend


def news_behind_chat(news: int, start_by: float, *, big_measured: bool) -> Harness:
    """chat (1 slot, loads in 5 s) served one 600 s request and four 10 s ones
    (longest recent: 600 s); more chat jobs wait; at 750 ``news`` deadline
    requests arrive for big (1 slot, loads in 20 s), which needs chat's memory.
    ``big_measured``: big served one 100 s request first (at 0, before chat)."""
    h = Harness(
        [BackendSpec(name="chat", gpus=("gpu0",)), BackendSpec(name="big", gpus=("gpu0",))],
        devices=(gpu(gib=24), host()),
        config=SchedulerConfig(batch_bound=4, urgency_window_s=0),
        profiles={"chat": (10, 1, 5), "big": (16, 1, 20)},
    )
    if big_measured:
        h.load("big", "b0", at=0)
        h.finish("b0", at=100)
    h.arrive("r0", "chat", priority=10, at=100)
    if big_measured:
        [stop] = h.decisions(StopBackend)
        assert stop.backend == "big"
        h.stopped("big", at=101)
    h.ready("chat", at=106)
    for i in range(1, 10):
        h.arrive(f"c{i}", "chat", priority=10, at=699)
    h.finish("r0", at=706)
    for i in range(1, 5):
        h.finish(f"c{i}", at=706 + 10 * i)
    assert h.dispatched()[-1] == "c5"
    for i in range(1, news + 1):
        h.arrive(f"news{i}", "big", priority=90, at=750, start_by=start_by)
    return h


def test_a_measured_swap_counts_the_services_before_its_last_start_by() -> None:
    # Three scripts of 100 s on one slot: the third starts 200 s after big is
    # ready, so big must start loading by 1400 - 20 - 200 = 1180. A chat request
    # dispatched at 756 could take 600 s (to 1356): it may not go first.
    h = news_behind_chat(3, start_by=1400, big_measured=True)
    [stop] = h.finish("c5", at=756)
    assert isinstance(stop, StopBackend) and stop.backend == "chat"
    [start] = h.stopped("chat", at=757)
    assert isinstance(start, StartBackend) and start.backend == "big"
    h.ready("big", at=777)
    h.finish("news1", at=877)
    h.finish("news2", at=977)
    assert h.dispatched()[-3:] == ["news1", "news2", "news3"]
    assert not h.decisions(Reject)


def test_a_measured_swap_with_room_for_the_services_still_lets_work_overtake() -> None:
    # 756 + 600 s <= 1600 - 20 - 200: the overtake leaves the third script its start.
    h = news_behind_chat(3, start_by=1600, big_measured=True)
    out = h.finish("c5", at=756)
    assert [d.request_id for d in out if isinstance(d, Dispatch)] == ["c6"]
    assert "overtake 1 of 4" in h.decisions(Dispatch)[-1].reason


def test_one_deadline_per_slot_needs_only_the_load_before_its_start_by() -> None:
    # One script: it starts as soon as big is ready; 756 + 600 <= 1400 - 20.
    h = news_behind_chat(1, start_by=1400, big_measured=True)
    out = h.finish("c5", at=756)
    assert [d.request_id for d in out if isinstance(d, Dispatch)] == ["c6"]


def test_an_unmeasured_swap_with_more_deadlines_than_slots_is_not_overtaken() -> None:
    # big never served a request: when its second and third scripts start is
    # unknown, so no overtake is promised to leave them their start-by.
    h = news_behind_chat(3, start_by=1400, big_measured=False)
    [stop] = h.finish("c5", at=756)
    assert isinstance(stop, StopBackend) and stop.backend == "chat"


def test_an_unmeasured_swap_with_one_deadline_per_slot_is_still_overtaken() -> None:
    h = news_behind_chat(1, start_by=1400, big_measured=False)
    out = h.finish("c5", at=756)
    assert [d.request_id for d in out if isinstance(d, Dispatch)] == ["c6"]
