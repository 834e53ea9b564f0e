"""What the core expects: load and service times, a backend's reload cost, the time
until a request could start, and whether swap batching still leaves the swap's
deadlines their slack.

Every function reads the records it is given and the settings; none changes
anything. Figures are learned from what the core saw (a measured load, the
recent service times) and fall back to the settings' defaults.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping

from yard.core import reasons
from yard.core.lifecycle import LOADED, BackendState
from yard.core.records import Backend
from yard.core.spec import SchedulerConfig

_GIB = 1024**3


def load_s(b: Backend, config: SchedulerConfig) -> float:
    """Seconds a load of ``b`` takes: the profile's, else the last seen, else the default."""
    if b.profile is not None and b.profile_has_load:
        return b.profile.load_s
    if b.learned_load_s is not None:
        return b.learned_load_s
    return config.default_load_s


def service_est(b: Backend, config: SchedulerConfig) -> float:
    """The mean seconds one request holds a slot (moving average)."""
    return b.service_ewma if b.service_ewma is not None else config.default_service_s


def service_hi(b: Backend, config: SchedulerConfig) -> float:
    """A high estimate of one request's service time (the longest of the recent
    ones): for promises about deadlines the mean is too hopeful."""
    if not b.service_recent:
        return config.default_service_s
    mean = b.service_ewma if b.service_ewma is not None else config.default_service_s
    longest = b.service_recent_max
    return longest if longest >= mean else mean  # max(), inline (asked per victim and swap)


def reload_per_gib(b: Backend, need: Mapping[str, int], config: SchedulerConfig) -> float:
    """Seconds a reload of ``b`` takes per GiB it holds (its reservation, else
    ``need``; at least one GiB counted)."""
    held = sum(b.reserved.values()) or sum(need.values())
    return load_s(b, config) / max(1.0, held / _GIB)


IDLE_GAPS_MIN = 8
"""How many gaps between its arrivals a backend must have shown before
:func:`idle_from` tells when it will stay idle."""
IDLE_CHANCE = 6
""":func:`idle_from` accepts a chance of a request before the window of one in
this many."""
IDLE_MARGIN = 2.0
"""How much longer than the longest gap it outlasted a backend must have been
idle (:func:`idle_from`): a gap longer than any seen so far is likely."""


def idle_from(b: Backend, until: float) -> float:
    """From when ``b``, idle, is expected to get no request before ``until``
    (``inf``: not before ``until``, or it has shown fewer than
    :data:`IDLE_GAPS_MIN` gaps between its requests, too few to tell).

    Its recent gaps between requests are the forecast: once its idle time is
    longer than a gap, that gap cannot be the one it is in. Of the ``n - i``
    gaps longer than the ``i`` it outlasted, ``k - i`` end before ``until``;
    the chance of a request before ``until`` is taken as ``(k - i + 1) / (n - i
    + 2)`` (Laplace's rule: having outlasted every gap seen says little of a
    gap never seen), and it is expected to stay idle once that is at most one
    in :data:`IDLE_CHANCE`, from :data:`IDLE_MARGIN` times the longest gap it
    must outlast after its last request. Image after the four show-art
    requests of an hour (gaps of a minute or three, then of two hours) is
    idle until the next news from some minutes after the last one, once it has
    seen three such hours; music at night (gaps of ten minutes, at random) not
    while the news is more than a few minutes away; chat (gaps of seconds)
    never. Cheap where it is asked (a sort of at most
    :data:`~yard.core.records.ARRIVAL_GAPS` gaps): only for a load ahead."""
    n = len(b.gaps)
    if n < IDLE_GAPS_MIN:
        return math.inf
    ordered = sorted(b.gaps)
    k = bisect.bisect_right(ordered, until - b.last_arrival)
    # Outlasting i of them (the shortest), k - i of the n - i left end before
    # until; the chance is taken as (k - i + 1) / (n - i + 2) (Laplace's rule:
    # having outlasted every gap seen says little of a gap never seen).
    # (k - i + 1) * m <= n - i + 2, in whole numbers
    m = IDLE_CHANCE
    outlast = max(0, -(-(m * (k + 1) - n - 2) // (m - 1)))
    if outlast > k:  # even with every gap ending before until outlasted
        return math.inf
    return b.last_arrival + IDLE_MARGIN * (ordered[outlast - 1] if outlast else 0.0)


def swap_latest_start(swap: Backend, config: SchedulerConfig) -> float | None:
    """The latest time the load of ``swap`` may start for every request waiting
    for it with a start-by to start by it (None: none has one).

    Once loaded, ``swap``'s slots serve those requests earliest start-by first
    (the order urgency gives them), each holding its slot for ``swap``'s high
    service estimate: the one with ``k`` of them before it starts ``k // slots``
    services after the load. Where ``swap`` has never served a request its
    service time is unknown, and only the first ``slots`` of them (those that
    start as soon as it is ready) can be promised a start: with more, the
    latest start is ``-inf`` (a start-by behind them may need the load at once).
    """
    start_bys = swap.queue.start_bys()
    if not start_bys:
        return None
    slots = max(1, swap.slots)
    load = load_s(swap, config)
    if len(start_bys) <= slots:
        return start_bys[0] - load
    if not swap.service_recent:
        return -math.inf
    return swap.queue.start_by_latest(slots, service_hi(swap, config), load)


def overtake_denied(
    victim: Backend, swap: Backend, now: float, config: SchedulerConfig
) -> str | None:
    """Why a request for ``victim`` may not go ahead of the swap to ``swap`` by
    the swap's deadlines (None: it may). It may not if its service could end
    after the swap's latest start (:func:`swap_latest_start`)."""
    latest = swap_latest_start(swap, config)
    if latest is None:
        return None
    hi = service_hi(victim, config)
    if now + hi <= latest:
        return None
    return reasons.overtake_denied(victim.name, hi, swap.name, latest - now)


def start_cost(
    b: Backend, now: float, config: SchedulerConfig, free_wait: Callable[[], float]
) -> tuple[float, str]:
    """Expected seconds until a request for ``b`` could start if it went first,
    and how. ``free_wait``: seconds until its best placement has room (asked only
    when it is not loaded)."""
    if b.state is BackendState.READY:
        if b.free_slots() > 0:
            return 0.0, reasons.ready_free(b.name)
        s = service_est(b, config)
        return s, reasons.ready_busy(b.name, s)
    if b.state is BackendState.STARTING:
        assert b.started_at is not None
        rem = max(0.0, b.started_at + load_s(b, config) - now)
        return rem, reasons.loading_left(b.name, rem)
    load = load_s(b, config)
    wait = free_wait()
    if b.state in LOADED:  # draining: wait for it to stop, then load again
        wait = max(wait, service_est(b, config))
    return load + wait, reasons.load_after(b.name, load, wait)


def worst_start_cost(b: Backend, drain: float, config: SchedulerConfig) -> float:
    """Start cost if it must be loaded after busy neighbours drain: used for
    urgency, because a loaded backend may be evicted while a request waits.
    ``drain``: the longest :func:`service_hi` of the other backends (every
    backend shares host memory with ``b``: each counts;
    :meth:`yard.core.state.Core.worst_drain`)."""
    return load_s(b, config) + drain
