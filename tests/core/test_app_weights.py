"""``[apps.NAME] weight`` in the core (yard.core.fairness): among requests within
``share_points`` of each other, the app further ahead of its share of service
goes later; outside that band priority and aging decide, and the wait bound
grows by exactly ``share_points / aging_rate`` and one load (the room given
back to a backend stopped for an app ahead of its share, yard.core.lending)."""

from __future__ import annotations

from tests.core.harness import GIB, Harness, host
from yard.core import (
    BackendSpec,
    Dispatch,
    ProfileMeasured,
    Scheduler,
    SchedulerConfig,
)

CONFIG = SchedulerConfig(share_points=30.0, default_service_s=10.0)


def harness(weights: dict[str, float] | None, config: SchedulerConfig = CONFIG) -> Harness:
    """One single-slot host backend, loaded in 1 s, with the given app weights."""
    backends = [BackendSpec(name="llm")]
    h = Harness(backends, devices=(host(),))
    h.s = Scheduler((host(),), backends, config, weights=weights)
    h.feed(ProfileMeasured(backend="llm", gpu_bytes=0, host_bytes=GIB, load_s=1.0, source="stored"))
    return h


def dispatch_times(h: Harness) -> list[tuple[float, str]]:
    return [(t, d.request_id) for t, d in h.log if isinstance(d, Dispatch)]


def test_an_app_ahead_of_its_share_goes_after_an_equal_priority_app_within_it() -> None:
    # batch (weight 0.5) asked for 3 x 10 s at once: start tags 0, 20, 40, so b2
    # ranks 20 points lower and b3 30 (the cap). chat asked for nothing before.
    h = harness({"batch": 0.5})
    for rid in ("b1", "b2", "b3"):
        h.arrive(rid, "llm", priority=10, app="batch", at=0.0)
    h.ready("llm", at=1.0)
    h.arrive("c1", "llm", priority=10, app="chat", at=2.0)
    h.finish("b1", at=11.0)
    h.finish("c1", at=21.0)
    view = h.s.explain("b3", 21.0)
    assert view is not None and view.effective_priority == 10 - 30 + 21
    h.finish("b2", at=31.0)
    assert dispatch_times(h) == [(1.0, "b1"), (11.0, "c1"), (21.0, "b2"), (31.0, "b3")]


def test_without_weights_the_same_requests_go_in_arrival_order() -> None:
    h = harness(None)
    for rid in ("b1", "b2", "b3"):
        h.arrive(rid, "llm", priority=10, app="batch", at=0.0)
    h.ready("llm", at=1.0)
    h.arrive("c1", "llm", priority=10, app="chat", at=2.0)
    h.finish("b1", at=11.0)
    h.finish("b2", at=21.0)
    h.finish("b3", at=31.0)
    assert dispatch_times(h) == [(1.0, "b1"), (11.0, "b2"), (21.0, "b3"), (31.0, "c1")]


def test_weights_never_reorder_requests_further_apart_than_the_band() -> None:
    # b2 loses 20 points, b3 30: chat at priority 10 still outranks them, but a
    # batch at 50 stays 40 - 30 = 10 points or more ahead of it.
    h = harness({"batch": 0.5})
    for rid in ("b1", "b2", "b3"):
        h.arrive(rid, "llm", priority=50, app="batch", at=0.0)
    h.ready("llm", at=1.0)
    h.arrive("c1", "llm", priority=10, app="chat", at=2.0)
    h.finish("b1", at=11.0)
    h.finish("b2", at=21.0)
    h.finish("b3", at=31.0)
    assert dispatch_times(h) == [(1.0, "b1"), (11.0, "b2"), (21.0, "b3"), (31.0, "c1")]


def test_a_flood_loses_at_most_the_band_so_aging_still_serves_it_first() -> None:
    # Five batch requests at 0 (tags 0..80: b3, b4, b5 lose the cap, 30 points,
    # rank -20). chat at 25 ranks 10 - 25 = -15: ahead of them; chat at 35 ranks
    # -25: behind all of them, as aging demands.
    h = harness({"batch": 0.5})
    for i in range(1, 6):
        h.arrive(f"b{i}", "llm", priority=10, app="batch", at=0.0)
    h.ready("llm", at=1.0)
    h.finish("b1", at=11.0)
    h.finish("b2", at=21.0)
    h.arrive("c1", "llm", priority=10, app="chat", at=25.0)
    h.finish("b3", at=31.0)
    h.arrive("c2", "llm", priority=10, app="chat", at=35.0)
    for rid, at in (("c1", 41.0), ("b4", 51.0), ("b5", 61.0)):
        h.finish(rid, at=at)
    assert dispatch_times(h) == [
        (1.0, "b1"),
        (11.0, "b2"),
        (21.0, "b3"),
        (31.0, "c1"),
        (41.0, "b4"),
        (51.0, "b5"),
        (61.0, "c2"),
    ]


def test_an_app_that_used_idle_time_loses_nothing_once_nobody_waits() -> None:
    # batch alone: b2 loses 20 points (tag 20), but once the queue is empty
    # nobody was kept waiting by its lead: virtual time catches up, and a batch
    # request after that loses nothing to a chat request beside it.
    h = harness({"batch": 0.5})
    h.arrive("b1", "llm", priority=10, app="batch", at=0.0)
    h.arrive("b2", "llm", priority=10, app="batch", at=0.0)
    h.ready("llm", at=1.0)
    h.finish("b1", at=11.0)
    h.finish("b2", at=21.0)
    h.arrive("c1", "llm", priority=10, app="chat", at=30.0)
    h.arrive("b3", "llm", priority=10, app="batch", at=30.0)
    view = h.s.explain("b3", 30.0)
    assert view is not None and view.effective_priority == 10
    h.arrive("b4", "llm", priority=10, app="batch", at=30.0)
    view = h.s.explain("b4", 30.0)
    assert view is not None and view.effective_priority == 10 - 20


def test_the_wait_bound_grows_by_the_band_over_the_aging_rate_and_one_load() -> None:
    # the band: share_points / aging_rate; the load: room given back to a
    # backend stopped for an app ahead of its share (yard.core.lending) may
    # start just before a request comes (llm loads in 1 s)
    config = SchedulerConfig(share_points=30.0, aging_rate=2.0)
    plain = harness(None, config)
    weighted = harness({"batch": 0.5}, config)
    for h in (plain, weighted):
        h.arrive("r1", "llm", at=0.0)
        h.ready("llm", at=1.0)
        h.finish("r1", at=3.0)
    with_weights = weighted.s.wait_bound()
    without = plain.s.wait_bound()
    assert with_weights is not None and without is not None
    assert with_weights - without == 15.0 + 1.0
