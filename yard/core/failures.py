"""Out-of-memory: did yard cause it, and how much a profile grows after one.

Pure functions of the records they are given. An out-of-memory is *self-caused*
when yard had over-committed the device: a load ran next to it, a reading showed
a backend above its profile or the device above its usable size, foreign memory
appeared after placement, or (no reading caught it) yard had placed other
backends on the same GPU. Alone on its device, an out-of-memory is the
backend's own.

A first start (no profile yet) that runs out of memory is yard's doing where
yard chose its place or its context (:func:`first_start_caused`): next to
other backends or to memory other processes hold, or at a context above the
minimum. Its waiting requests stay in their place, and the next start steps
down the ladder (:func:`ladder`): the prior's fit (the first start), then the
minimum context, then alone at the minimum. A start is never the same as one
that failed (same devices, context and company): a step that would repeat it
is skipped, and where no step is left the model does not fit, even at its
minimum alone, and its requests get 503 ``does_not_fit``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from yard.core import reasons, resources
from yard.core.lifecycle import BackendState
from yard.core.records import Backend, Device
from yard.core.spec import HOST, Profile, SchedulerConfig

RECENT_LOAD_S = 5.0
"""An OOM this soon after another backend on the same device became ready
counts as caused by that load (its peak may outlast the health check)."""
RAISE_FACTOR = 1.10
"""A profile grows by at least this factor after a self-caused OOM."""

RAISE_MIN_BYTES = 32 * 2**20
RAISE_MIN_FRACTION = 0.02
"""A live reading raises a profile only when it is above it by a meaningful
step: at least this fraction of the profile's figure and at least
``RAISE_MIN_BYTES``. A server's host memory creeps by kilobytes as it serves
(allocator pages, caches): raising for each creep flooded the log with
"0.6 GiB above its profile 0.6 GiB" every second or two, and changed no
placement."""

Occupants = Callable[[str], Iterable[Backend]]
"""The backends holding memory on a device."""


def meaningfully_above(nbytes: int, limit: int) -> bool:
    """Whether a reading of ``nbytes`` is above a profile's ``limit`` by a
    meaningful step (:data:`RAISE_MIN_FRACTION` and :data:`RAISE_MIN_BYTES`)."""
    return nbytes > limit + max(RAISE_MIN_BYTES, math.ceil(limit * RAISE_MIN_FRACTION))


def self_caused(b: Backend, occupants: Occupants, now: float) -> str | None:
    """Why yard over-committed one of ``b``'s devices, or None."""
    if b.overcommit is not None:
        return b.overcommit
    for d in b.devices:
        for o in occupants(d):
            if o is b:
                continue
            if o.state is BackendState.STARTING:
                return f"{o.name} was loading on {d} at the same time"
            recent = o.ready_at is not None and now - o.ready_at <= RECENT_LOAD_S
            if recent and d in b.primary:
                return f"{o.name} had just loaded on {d}"
    # No reading caught anyone above their profile, but yard placed other
    # backends on the same device: together they outgrew it, so a profile
    # proved too small.
    for d in b.primary:
        others = [o.name for o in occupants(d) if o is not b]
        if others:
            return reasons.shared_and_outgrew(d, others)
    return None


def raised_profile(
    b: Backend, occupants: Occupants, devices: Mapping[str, Device], config: SchedulerConfig
) -> Profile | None:
    """``b``'s profile after it ran out of memory by yard's doing (None: it has none).

    At least ``RAISE_FACTOR`` more, at least the last live reading (the profile is
    a peak without margin: a live reading is one), and on a shared GPU more than
    was left for it there: next to the same neighbours it would run out again, so
    it is placed elsewhere or alone until live readings tell better.
    """
    if b.profile is None:
        return None
    old = resources.at(b.profile, b.context, b.parallel)  # raised where it ran out
    live_gpu = max((b.live.get(g, 0) for g in b.gpus), default=0)
    live_host = b.live.get(HOST, 0)
    crowded = 0
    for g in b.gpus:
        others = sum(o.held(g) for o in occupants(g) if o is not b)
        if others:
            dev = devices[g]
            left = dev.spec.usable_bytes - dev.foreign - others
            crowded = max(crowded, math.floor(left / config.profile_margin) + 1)
    return replace(
        old,
        gpu_bytes=max(math.ceil(old.gpu_bytes * RAISE_FACTOR), live_gpu, crowded)
        if b.gpus
        else old.gpu_bytes,
        host_bytes=max(math.ceil(old.host_bytes * RAISE_FACTOR), live_host),
    )


@dataclass(frozen=True, slots=True)
class Step:
    """How a first start is made: at the minimum context, alone on its devices."""

    minimum: bool
    alone: bool


def ladder(b: Backend) -> list[Step]:
    """The first starts of ``b``, in the order they are tried after each that
    ran out of memory by yard's doing: as placement chooses (the prior's fit),
    the minimum context (only where the range offers more), alone there."""
    steps = [Step(minimum=False, alone=False)]
    span = resources.offered(b.spec)
    if span is not None and span[0] < span[1]:
        steps.append(Step(minimum=True, alone=False))
    steps.append(Step(minimum=True, alone=True))
    return steps


def step(b: Backend) -> Step:
    """How ``b``'s next start is made (measured backends: as placement chooses)."""
    if b.profile is not None:
        return Step(minimum=False, alone=False)
    steps = ladder(b)
    return steps[min(b.self_caused_start_failures, len(steps) - 1)]


def next_step(b: Backend, alone_now: bool) -> int | None:
    """The ladder's index for ``b``'s next start after its start at
    ``b.context`` (alone on its devices: ``alone_now``) ran out of memory, or
    None when every step left would repeat it or none is left."""
    steps = ladder(b)
    span = resources.offered(b.spec)
    at_minimum = span is None or b.context is None or b.context <= span[0]
    for index in range(b.self_caused_start_failures + 1, len(steps)):
        s = steps[index]
        smaller = s.minimum and not at_minimum
        emptier = s.alone and not alone_now
        if smaller or emptier:
            return index
    return None


def first_start_caused(
    b: Backend, occupants: Occupants, devices: Mapping[str, Device]
) -> str | None:
    """Why the first start of ``b`` (no profile) that ran out of memory is
    yard's doing, or None: alone, at its minimum context (or with no range),
    on a device nobody else uses."""
    others = sorted({o.name for d in b.primary for o in occupants(d) if o is not b})
    if others:
        return f"yard placed it next to {', '.join(others)}"
    foreign = {d: devices[d].foreign for d in b.primary if devices[d].foreign > 0}
    span = resources.offered(b.spec)
    if span is not None and b.context is not None and b.context > span[0]:
        return f"yard chose context {b.context:,} (of {span[0]:,}-{span[1]:,})"
    if foreign:
        where = ", ".join(f"{reasons.gib(n)} on {d}" for d, n in foreign.items())
        return f"yard placed it next to memory other processes hold ({where})"
    return None
