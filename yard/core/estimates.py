"""What the core expects: load and service times, a backend's reload cost, the time
until a request could start, and whether swap batching still leaves the swap's
deadlines their slack.

Every function reads the records it is given and the settings; none changes
anything. Figures are learned from what the core saw (a measured load, the
recent service times) and fall back to the settings' defaults.
"""

from __future__ import annotations

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
    return max(b.service_recent_max, service_est(b, config))


def reload_per_gib(b: Backend, need: Mapping[str, int], config: SchedulerConfig) -> float:
    """Seconds a reload of ``b`` takes per GiB it holds (its reservation, else
    ``need``; at least one GiB counted)."""
    held = sum(b.reserved.values()) or sum(need.values())
    return load_s(b, config) / max(1.0, held / _GIB)


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
