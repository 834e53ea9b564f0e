"""When a window's backend may load early: what it must evict is idle and
expected to stay so until the window opens (:mod:`yard.core.windows` asks).

Reads the core's records, changes nothing. The forecast of each idle backend
is :func:`yard.core.estimates.idle_from`.
"""

from __future__ import annotations

import math

from yard.core import estimates
from yard.core.lifecycle import BackendState
from yard.core.records import Backend
from yard.core.spec import HOST
from yard.core.state import Core
from yard.core.window_state import Window


def early_at(core: Core, b: Backend, win: Window, now: float) -> float:
    """From when ``b``, stopped, may load for ``win`` before it is near: on one
    of its GPU sets, the memory it needs is free but for what idle backends
    hold that are expected to stay idle until the window opens
    (:func:`yard.core.estimates.idle_from`); ``inf``: not by what is loaded
    now (a busy backend or one in use stands in the way, it is loaded, or a
    load or a stop runs on its devices), or
    it fits now on a GPU set (it loads when near, as before: early, it would
    keep others from that memory for half an hour)."""
    if b.state not in (BackendState.STOPPED, BackendState.FAILED):
        return math.inf
    best = math.inf
    for gpus, need in core.options(b):
        at = now
        evicts = False
        for d in (*gpus, HOST):
            dev = core.devices[d]
            free = dev.spec.usable_bytes - dev.foreign
            idle: list[tuple[float, int]] = []
            for o in core.occupants(d):
                held = o.held(d)
                free -= held
                if d != HOST and o.state in (BackendState.STARTING, BackendState.STOPPING):
                    return math.inf  # memory in flux, promised to a load: not now
                # idle, or held (drained, idle) while its own stand-in is near:
                # for its urgent load, not yet due
                held_for_b = o.drain_reason == "swap" and b.ahead is win.stand_in
                if (
                    (o.state is BackendState.READY or held_for_b)
                    and not o.pinned
                    and not o.running
                    and not o.queue.size
                    and o.ahead is None
                ):
                    idle.append((max(now, estimates.idle_from(o, win.opens)), held))
            if need[d] > free:
                evicts = True
                at = max(at, _freed_at(free, need[d], idle, win.opens))
                if at == math.inf:
                    break
        if not evicts:
            return math.inf  # it fits now: it loads when near, as before
        best = min(best, at)
    return best


def _freed_at(free: int, need: int, idle: list[tuple[float, int]], opens: float) -> float:
    """When ``need`` bytes are free, where ``free`` are now and each of ``idle``
    (from when, bytes held) may go from its time before ``opens`` (``inf``:
    not before ``opens``)."""
    for t, held in sorted(idle, key=lambda x: x[0]):
        if t >= opens:
            break
        free += held
        if need <= free:
            return t
    return math.inf
