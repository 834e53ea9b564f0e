"""The floor of issue 27's one-GPU target among schedules that are no harsher at
their worst than first come, first served.

:func:`sim.targets_ahead.counted_bound` is a floor for *any* schedule. It is
reached by knowing every service time and, where that lowers the p95, letting a
script wait longer than first come makes any script wait all day (166 s on seed
2024), so that the others of its busy period wait less: the p95 leaves its seven
longest waits out, and the floor spends them. On seed 2024 at 02:31 it holds the
first script back, the GPU idle, until the second has come: the second and third
start at once and the first waits 259 s; in the breaking news at 10:33 the second
longest wait can fall from 157 s to 118 s only if another waits past 166 s.

A gateway that ages waiting requests and bounds their wait (``docs/wait-bound.md``)
does not do that, and its users would not want it: a script's deadline is its own,
not the day's p95. :func:`fair_bound` is the same count restricted to the
schedules whose longest wait is no more than first come's longest (news-llm and
tts always loaded, as for the other floors). A policy in that class, clairvoyant
or not, keeping the GPU idle or not, cannot go below it. yard is in that class on
the judged days exactly when its longest high wait is no more than first come's;
``python -m sim targets`` prints both beside the floor.

Below that floor on seed 2024 (84.75 s against yard's 98.7 s), every schedule
holds news-llm idle while a script waits. At 08:34 a 141 s script comes alone and
a 80 s one 4.9 s later; at 23:31 a 109 s one, then a 91 s one 1.7 s later. The
floor waits for the second and serves it first, because it is the shorter:
nothing a request carries says so (the scripts' lengths are drawn alike and
apart from everything else). Had the two lengths been the other way round, the
same hold would have made the first wait 145.5 s and 110.7 s, where first come
makes the second wait 75.0 s and 89.3 s. ``fair_bound(..., idle_while_waiting=False)`` is the
floor of the schedules that never do that on news-llm: 98.73 s on seed 2024,
first come's own p95, and the other judged seeds' fair floors unchanged.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from sim import scenarios, scenarios_ahead
from sim.targets_ahead import (
    _add_to_front,
    _at,
    _busy_periods,
    _list_waits,
    _period_tail,
    nearest_rank_floor,
)
from sim.workload import Arrival

FAIR_EXACT_UP_TO = 10
"""Busy periods of up to this many requests get their exact capped tail
(:func:`capped_tail`); longer ones the uncapped :func:`sim.targets_ahead._period_tail`,
which is lower and so still a floor."""


def first_come_longest(arrivals: Sequence[Arrival], slots: Mapping[str, int]) -> float:
    """The longest wait of the high-class ``arrivals`` for the backends in ``slots``
    (backend: slots), each always loaded, first come, first served."""
    longest = 0.0
    for backend, count in slots.items():
        mine = sorted((a for a in arrivals if a.cls == "high" and a.backend == backend), key=_at)
        for period in _busy_periods(mine, count):
            longest = max(longest, *_list_waits(period, count))
    return longest


def fair_bound(
    arrivals: Sequence[Arrival], slots: Mapping[str, int], *, idle_while_waiting: bool = True
) -> float:
    """The least high-class p95 wait (nearest rank, as the other floors) of any
    schedule of ``arrivals`` on the always-loaded backends of ``slots`` whose
    every wait is at most :func:`first_come_longest`; the count is
    :func:`sim.targets_ahead.counted_bound`'s, with each period's tail from
    :func:`capped_tail`. Without ``idle_while_waiting``, a one-slot backend's
    schedules also never leave it free while one of its requests waits (those
    with more slots still may: their floor is then lower, and still a floor).

    Why the periods may be taken one by one: a schedule of the whole day,
    restricted to a busy period, is no better than the list schedule of its own
    order run alone (each request starts no later there), so that one keeps every
    wait within the cap too and has no more waits above any ``T``. On one slot a
    schedule that never idles while a request waits has first come's busy
    periods, and restricted to one it is that period's own such schedule."""
    cap = first_come_longest(arrivals, slots)
    tails: list[list[float]] = []
    for backend, count in slots.items():
        mine = sorted((a for a in arrivals if a.cls == "high" and a.backend == backend), key=_at)
        for period in _busy_periods(mine, count):
            if len(period) <= FAIR_EXACT_UP_TO:
                hold = idle_while_waiting or count != 1
                tails.append(capped_tail(period, count, cap, idle_while_waiting=hold))
            else:
                tails.append(_period_tail(period, count))
    return nearest_rank_floor(tails, sum(1 for a in arrivals if a.cls == "high"))


State = tuple[tuple[float, ...], tuple[float, ...]]
"""The ``c + 1`` longest waits so far (longest first, 0-padded) and the slots'
free times (sorted)."""


def capped_tail(
    period: Sequence[Arrival], slots: int, cap: float, *, idle_while_waiting: bool = True
) -> list[float]:
    """``g[c]``: the smallest ``(c+1)``-th longest wait of ``period`` over the orders
    of its requests whose list schedule (each started as soon as it has come and a
    slot is free: :func:`sim.targets_ahead._list_waits`) keeps every wait at most
    ``cap``; ``inf`` where no order does.

    One pass over the sets of requests per ``c``: a state is an order of a set,
    kept as its ``c + 1`` longest waits and the slots' free times; what comes
    after depends on nothing else, and a state that is no better in either than
    another of the same set is dropped. The waits are the list schedule's own
    sums, so the result equals trying every order (tests/sim/test_fair_floor.py).

    Without ``idle_while_waiting`` (one slot only), only the orders that never
    leave the slot free while a request that has come waits: each request starts
    when the one before ends, unless none not yet started has come. Within a busy
    period such an order keeps the slot busy throughout, so every state of a set
    frees the slot at the same time and dropping states by their waits alone is
    still sound (with more slots a later free time could allow what an earlier
    one forbids, so the pass would not be)."""
    if not idle_while_waiting and slots != 1:
        raise ValueError("idle_while_waiting=False is worked out for one slot only")
    n = len(period)
    tail: list[float] = []
    for c in range(n):
        fronts: list[list[State]] = [[] for _ in range(1 << n)]
        fronts[0].append(((0.0,) * (c + 1), (0.0,) * slots))
        for mask in range(1 << n):
            front = fronts[mask]
            for j, a in enumerate(period):
                if mask >> j & 1:
                    continue
                after = fronts[mask | 1 << j]
                # Starting ``a`` on a slot free before it comes holds that slot
                # idle; another request not yet started that came first waits then.
                no_hold = not idle_while_waiting and any(
                    not mask >> k & 1 and b.at < a.at for k, b in enumerate(period)
                )
                for top, free in front:
                    if no_hold and free[0] < a.at:
                        continue
                    start = max(a.at, free[0])
                    wait = start - a.at
                    if wait > cap:
                        continue
                    state = (
                        tuple(sorted((*top, wait), reverse=True)[: c + 1]),
                        tuple(sorted((start + a.service_s, *free[1:]))),
                    )
                    _add_to_front(after, state, _covers)
        tail.append(min((top[c] for top, _ in fronts[-1]), default=math.inf))
    return tail


def _covers(x: State, y: State) -> bool:
    """Whether ``x``'s longest waits and free times are each no later than ``y``'s."""
    return all(u <= v for u, v in zip(x[0], y[0], strict=True)) and all(
        u <= v for u, v in zip(x[1], y[1], strict=True)
    )


def instances_fair_bound(seed: int, gpus: int, *, idle_while_waiting: bool = True) -> float:
    """:func:`fair_bound` of the radio day of ``seed`` with the news-llm instances
    of the announced day on ``gpus`` GPUs (one slot each) and tts's two slots."""
    count = scenarios_ahead.NEWS_INSTANCES.get(gpus, 1)
    return fair_bound(
        scenarios.radio_day_workload(random.Random(seed)),
        {"news-llm": count, "tts": 2},
        idle_while_waiting=idle_while_waiting,
    )


def instances_first_come_longest(seed: int, gpus: int) -> float:
    """:func:`first_come_longest` of the same day and instances: the cap of
    :func:`instances_fair_bound`."""
    count = scenarios_ahead.NEWS_INSTANCES.get(gpus, 1)
    return first_come_longest(
        scenarios.radio_day_workload(random.Random(seed)), {"news-llm": count, "tts": 2}
    )
