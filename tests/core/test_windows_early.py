"""A window's backend loads early, up to half an hour before the window opens,
where what it must evict is idle and expected to stay so until the window
(yard.core.early.early_at, yard.core.estimates.idle_from); where that is in
use, it loads when its load is due, as before."""

from __future__ import annotations

import math

from tests.core.harness import Harness
from tests.core.test_windows import announced, machine
from yard.core import RequestArrived, StartBackend, StopBackend, estimates

OPENS = 12600.0
"""chat's announced window opens at 3.5 h; early loading may begin at 3 h."""


BURSTS = [burst * 2700.0 + k * 60.0 for burst in range(5) for k in range(4)]
"""big's requests: four a minute apart every 45 minutes, the last at 10980."""


def art(rid: str) -> RequestArrived:
    return RequestArrived(request_id=rid, backend="big", priority=40, app="art")


def day(h: Harness, big_at: list[float]) -> None:
    """big (16 GiB, 30 s load) serves requests of 10 s at ``big_at``; chat (16 GiB,
    20 s load) has a window at ``OPENS``: the two fit one at a time. Its load is
    due at OPENS - 20 - 2 (lead margin) = 12578 (urgent from 12568)."""
    h.feed(announced("news", "chat", OPENS, OPENS + 600, count=1), at=0)
    arrivals = [(t, art(f"a{i}")) for i, t in enumerate(big_at)]
    arrivals.append((OPENS, RequestArrived(request_id="n1", backend="chat", priority=90)))
    service = {f"a{i}": 10.0 for i in range(len(big_at))} | {"n1": 60.0}
    h.play(arrivals, service, until=OPENS + 100)


def chat_starts(h: Harness) -> list[float]:
    return [t for t, d in h.log if isinstance(d, StartBackend) and d.backend == "chat"]


def test_an_idle_victim_between_bursts_is_replaced_early() -> None:
    # Four requests a minute apart every 45 minutes: after the last one of the
    # fifth burst (at 10980), with four long gaps seen, a request before the
    # window is one chance in six; big is expected to stay idle once it has
    # been idle twice the longest gap within a burst: 10980 + 2 x 60 = 11100.
    h = machine()
    day(h, BURSTS)
    [stop] = [(t, d) for t, d in h.log if isinstance(d, StopBackend)]
    assert stop[0] == 11100.0 and stop[1].backend == "big"
    assert "making room for chat" in stop[1].reason
    assert chat_starts(h) == [11101.0]  # big took a second to stop
    [start] = [d for d in h.decisions(StartBackend) if d.backend == "chat"]
    assert "early: what it evicts is expected to stay idle until t=12600" in start.reason
    assert dict((rid, t) for t, rid in h.dispatch_times())["n1"] == OPENS


def test_a_victim_in_constant_use_is_not_replaced_early() -> None:
    # big has a request every 30 s: whatever its idle time, one is expected soon.
    h = machine()
    day(h, [t * 30.0 for t in range(int(OPENS // 30))])
    assert chat_starts(h) == [12579.0]  # big stopped when the load was due (12578)


def test_a_victim_with_too_few_gaps_seen_is_not_replaced_early() -> None:
    # Four bursts so far: three long gaps, a request before the window one
    # chance in five (Laplace's rule): too likely.
    h = machine()
    day(h, BURSTS[4:])
    assert chat_starts(h) == [12579.0]


def test_early_loads_planned_afresh_decide_the_same() -> None:
    h, ref = machine(), machine(reference=True)
    day(h, BURSTS)
    day(ref, BURSTS)
    assert ref.log == h.log


def test_idle_from_reads_the_gaps_between_requests() -> None:
    """Of the gaps longer than the idle time, at most one in six may end
    before the window (one more counted, Laplace's rule); then twice the
    longest gap outlasted."""
    h = machine()
    for i, t in enumerate([0.0, 60.0, 120.0, 3600.0, 3660.0, 3720.0, 7200.0, 7260.0, 7320.0]):
        h.arrive(f"a{i}", "big", at=t)
    big = h.s._core.backends["big"]  # the record under test
    assert len(big.gaps) == 8  # 60 60 3480 60 60 3480 60 60
    # window at 9000: six short gaps end before it, two long ones do not:
    # (0 + 1) / (2 + 2) > 1/5 even with every short gap outlasted
    assert estimates.idle_from(big, 9000.0) == math.inf
    # window at 7350, 30 s after the last request: no gap is that short
    assert estimates.idle_from(big, 7350.0) == 7320.0
    # every gap ends before a window at 20000: none is left to outlast
    assert estimates.idle_from(big, 20000.0) == math.inf
