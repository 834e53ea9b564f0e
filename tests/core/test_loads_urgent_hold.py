"""An urgent announced window holds what it will evict; it loads when its load is due.

An announced window becomes urgent a drain before its load must start, so that
busy neighbours take no new work and drain in time. An idle neighbour has
nothing to drain: stopping it then, long before the load is due, only costs a
reload when a request that outranks the window comes for it meanwhile (the
radio day: a music job at 02:25 evicted news-llm loaded for 02:30, which was
then loaded again).
"""

from __future__ import annotations

from tests.core.harness import Harness
from tests.core.test_windows import announced, machine
from yard.core import RequestArrived, StartBackend, StopBackend


def music(rid: str) -> RequestArrived:
    return RequestArrived(request_id=rid, backend="big", priority=10, app="music")


def night(h: Harness, until: float = 1100.0) -> None:
    """big (music, priority 10, loads in 30 s) and chat (loads in 20 s) fit one at a
    time. chat's announced window (priority 90) opens at 1000. m0 (300 s) tells
    the core big's jobs run 300 s: chat's window is urgent from 1000 - 20 - 300 - 2
    (lead margin) = 678, and from then its stand-in ranks as an urgent request
    that came then (90 + 200 - 678). m1 (at 700) and m2 (at 910) rank below it
    (10 - 700, 10 - 910), and big's jobs are expected to run 300 s: neither
    would end by the time chat's load is due (978)."""
    h.feed(announced("news", "chat", 1000.0, 1600.0, count=1), at=0)
    arrivals = [
        (0.0, music("m0")),
        (700.0, music("m1")),
        (910.0, music("m2")),
        (1000.0, RequestArrived(request_id="n1", backend="chat", priority=90, app="radio")),
    ]
    service = {"m0": 300.0, "m1": 200.0, "m2": 300.0, "n1": 60.0}
    h.play(arrivals, service, until=until)


def test_an_urgent_window_keeps_an_idle_neighbour_loaded_until_its_load_is_due() -> None:
    h = machine()
    night(h)
    # Before: big stopped at 678 and chat loaded; a request outranking the window
    # evicted chat at 700 and loaded big again; chat loaded a second time at 932.
    starts = [(t, d.backend) for t, d in h.log if isinstance(d, StartBackend)]
    assert starts == [(0.0, "big"), (979.0, "chat"), (1061.0, "big")]
    # big is held from 678 (no new work that would run into the load), and
    # stops when chat's load is due: 1000 - 20 - 2 = 978.
    stops = [(t, d) for t, d in h.log if isinstance(d, StopBackend)]
    assert [(t, d.backend) for t, d in stops] == [(978.0, "big"), (1060.0, "chat")]
    assert "making room for chat" in stops[0][1].reason
    assert h.dispatch_times() == [(30.0, "m0"), (1000.0, "n1"), (1091.0, "m1")]


def test_a_held_neighbour_says_why_it_takes_no_new_work() -> None:
    h = machine()
    night(h, until=950)
    assert h.state("big") == "draining"
    [big] = [b for b in h.s.snapshot(950.0).backends if b.name == "big"]
    assert big.reason.startswith("held for chat: no new work until its load is due")
    view = h.s.explain("m1", 950.0)
    assert view is not None
    assert view.reason == (
        "waiting: big is draining (held for chat: no new work until its load is due "
        "(gpu0: chat needs 17.6 GiB, 6.4 GiB free))"
    )


def test_held_and_planned_afresh_decide_the_same() -> None:
    h = machine()
    ref = machine(reference=True)
    night(h)
    night(ref)
    assert ref.log == h.log
