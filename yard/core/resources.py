"""Optional resources: a backend's context size and slot count, chosen at each start.

A backend may declare a range for a setting that changes its memory: the
context size (``BackendSpec.context``: min, max) and the number of parallel
slots (``BackendSpec.parallel``). Its memory is learned as a line in each
setting, per device, through a measured point (``Profile.context``,
``Profile.parallel``)::

    bytes(c, p) = bytes(c0, p0) + per_token x (c - c0) + per_slot x (p - p0)

with the slopes learned from a second point that differs in that setting alone
(``gpu_per_token``/``host_per_token``, ``gpu_per_slot``/``host_per_slot``).
For llama-server that is a fixed part (weights, buffers) plus the KV cache,
which grows by the same bytes for every token of context, and, where each slot
gets its own context (``-c {total_context} -np {parallel}``), by the same bytes
for every slot.

Rules
-----

- The *required* part is the memory at the minimum of each range: a backend is
  placed (and room made for it) by that need alone. At the start itself it
  gets the largest setting that fits in what is free on each of its devices,
  down to the minimum; room is never made for the optional part.
- The order is fixed: **the context first, up to its maximum, then the
  slots**. A backend gets more slots only once its context is at its maximum
  (or at the one measured value, while its token slope is unknown), so every
  start lies on one path, ``(min, pmin) -> (max, pmin) -> (max,
  pmax)``, along which the memory only grows. That path is also what keeps
  the line honest where the memory is a product (each slot its own context:
  ``bytes = fixed + k x c x p``): the token slope holds at the minimum slot
  count and the slot slope at the maximum context, which is where ``yard
  probe`` measures them (``(min, pmin)``, ``(max, pmin)``, ``(max, pmax)``);
  the additive line is exact on the path.
- Contexts are chosen in multiples of :data:`STEP` tokens (or the minimum),
  slot counts one by one.
- A first load (no profile) is placed by the prior read from its model file
  (:class:`~yard.core.spec.Prior`: weights, KV bytes per token, compute), a
  line of the same shape: it starts at the largest context that estimate says
  fits next to what is there, foreign memory included, and is measured there.
  With no prior either, it starts at both maxima, the worst case.
- A context above the model's trained one is not offered (:func:`offered`):
  llama-server caps each slot there anyway, while its cache takes the memory
  of the whole ``-c``.
- A start that ran out of memory by yard's doing steps down
  (:mod:`yard.core.failures`): the next one gets the minimum context.
- With one point and no slope, a setting starts at its measured value, which is
  all that is known (memory grows with it, so it is a safe bound for smaller
  ones only); a second point at another value gives the slope.

Pure functions of their arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from yard.core import reasons
from yard.core.spec import HOST, BackendSpec, Profile

STEP = 256
"""Contexts are chosen in multiples of this many tokens (llama.cpp pads its
context to 256), or the range's minimum."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """What one start gets.

    context, parallel: the chosen values (None: the backend has no such range).
    need: the reservation on each device at them.
    why: a sentence per setting, for the start's reason.
    """

    context: int | None
    parallel: int | None
    need: dict[str, int]
    why: str


def offered(spec: BackendSpec) -> tuple[int, int] | None:
    """The context range a start may be given: the configured one, capped at
    the model's trained context where the prior knows it (None: no range)."""
    span = spec.context
    prior = spec.prior
    if span is None or prior is None or prior.trained_context is None:
        return span
    low, high = span
    cap = prior.trained_context
    if high <= cap:
        return span
    return min(low, cap), cap


def context_of(
    context: tuple[int, int] | None, profile: Profile | None, gpus: tuple[str, ...]
) -> int | None:
    """The context whose need is the *required* part (None: no range): the
    minimum where the slope is known, the measured context with one point,
    the maximum for a first load."""
    if context is None:
        return None
    low, high = context
    if profile is None or profile.context is None:
        return high
    if not has_slope(profile, gpus):
        return min(max(profile.context, low), high)
    return low


def parallel_of(
    parallel: tuple[int, int] | None, profile: Profile | None, gpus: tuple[str, ...]
) -> int | None:
    """The slot count whose need is the *required* part (None: no range), as
    :func:`context_of` for the context."""
    if parallel is None:
        return None
    low, high = parallel
    if profile is None or profile.parallel is None:
        return high
    if not has_slot_slope(profile, gpus):
        return min(max(profile.parallel, low), high)
    return low


def required(
    spec: BackendSpec, profile: Profile | None, gpus: tuple[str, ...]
) -> tuple[int | None, int | None]:
    """The (context, slots) whose need is the *required* part."""
    return context_of(offered(spec), profile, gpus), parallel_of(spec.parallel, profile, gpus)


def has_slope(profile: Profile, gpus: tuple[str, ...]) -> bool:
    """Whether the profile knows how its memory grows with the context (on
    the host, and on the GPUs when it has any)."""
    if profile.host_per_token is None:
        return False
    return not gpus or profile.gpu_per_token is not None


def has_slot_slope(profile: Profile, gpus: tuple[str, ...]) -> bool:
    """Whether the profile knows how its memory grows with the slot count."""
    if profile.host_per_slot is None:
        return False
    return not gpus or profile.gpu_per_slot is not None


def need_at(
    profile: Profile | None,
    gpus: tuple[str, ...],
    margin: float,
    context: int | None,
    parallel: int | None = None,
) -> dict[str, int]:
    """The reservation (figures x ``margin``) on each device of a placement on
    ``gpus`` at ``context`` and ``parallel`` slots (0s while unmeasured)."""
    if profile is None:
        need = dict.fromkeys(gpus, 0)
        need[HOST] = 0
        return need
    gpu_bytes, host_bytes = float(profile.gpu_bytes), float(profile.host_bytes)
    if context is not None and profile.context is not None and context != profile.context:
        delta = context - profile.context
        gpu_bytes += (profile.gpu_per_token or 0.0) * delta
        host_bytes += (profile.host_per_token or 0.0) * delta
    if parallel is not None and profile.parallel is not None and parallel != profile.parallel:
        slots = parallel - profile.parallel
        gpu_bytes += (profile.gpu_per_slot or 0.0) * slots
        host_bytes += (profile.host_per_slot or 0.0) * slots
    need = {g: math.ceil(max(0.0, gpu_bytes) * margin) for g in gpus}
    need[HOST] = math.ceil(max(0.0, host_bytes) * margin)
    return need


def _largest(
    low: int,
    high: int,
    step: int,
    at_low: Mapping[str, int],
    slope: Callable[[str], float],
    free: Mapping[str, int],
    need: Callable[[int], Mapping[str, int]],
) -> int:
    """The largest value in ``[low, high]`` (``low``, ``high``, or a multiple
    of ``step``) whose ``need`` fits in ``free``. Each device's need is a line
    from ``at_low`` with ``slope`` bytes per unit: the largest fitting value is
    found per device, the smallest of those taken, and then moved to the exact
    answer against ``need`` itself (rounding)."""
    cap = high
    for device, room in free.items():
        per_unit = slope(device)
        if per_unit > 0 and device in at_low:
            units = (room - at_low[device]) / per_unit
            # A slope of a few bytes in a lot of room is far beyond the range
            # (and a tiny one overflows to infinity).
            if units < high - low:
                cap = min(cap, low + math.floor(units))
    best = high if cap >= high else max(low, cap // step * step)

    def fits(value: int) -> bool:
        return all(n <= free.get(d, n) for d, n in need(value).items())

    # The per-device lines round (a need is whole bytes, the margin applied
    # before rounding up): settle on the exact answer from the estimate.
    while best > low and not fits(best):
        best = max(low, (best - 1) // step * step)
    while best < high and fits(up := min(high, best // step * step + step)):
        best = up
    return best


def grow(
    context: tuple[int, int] | None,
    profile: Profile | None,
    gpus: tuple[str, ...],
    margin: float,
    free: Mapping[str, int],
    parallel: int | None = None,
) -> tuple[int, dict[str, int]] | None:
    """The largest context that fits in ``free`` (per device) at ``parallel``
    slots, and its need, from the required one up; None when the backend has
    no choice to make (no range, no profile, or no slope)."""
    if context is None or profile is None or profile.context is None:
        return None
    if not has_slope(profile, gpus):
        return None
    low, high = context

    def need(c: int) -> dict[str, int]:
        return need_at(profile, gpus, margin, c, parallel)

    def slope(device: str) -> float:
        per_token = profile.host_per_token if device == HOST else profile.gpu_per_token
        return (per_token or 0.0) * margin

    best = _largest(low, high, STEP, need(low), slope, free, need)
    return best, need(best)


def grow_slots(
    parallel: tuple[int, int] | None,
    profile: Profile | None,
    gpus: tuple[str, ...],
    margin: float,
    free: Mapping[str, int],
    context: int | None,
) -> tuple[int, dict[str, int]] | None:
    """The largest slot count that fits in ``free`` at ``context``, and its
    need, from the required one up; None when there is no choice to make."""
    if parallel is None or profile is None or profile.parallel is None:
        return None
    if not has_slot_slope(profile, gpus):
        return None
    low, high = parallel

    def need(p: int) -> dict[str, int]:
        return need_at(profile, gpus, margin, context, p)

    def slope(device: str) -> float:
        per_slot = profile.host_per_slot if device == HOST else profile.gpu_per_slot
        return (per_slot or 0.0) * margin

    best = _largest(low, high, 1, need(low), slope, free, need)
    return best, need(best)


def choose(
    spec: BackendSpec,
    profile: Profile | None,
    gpus: tuple[str, ...],
    margin: float,
    free: Mapping[str, int],
    *,
    estimated: str | None = None,
    minimum: bool = False,
) -> Choice | None:
    """What a start on ``gpus`` gets, with ``free`` bytes free on each device
    (the required part is known to fit): the context first, as large as fits
    up to its maximum (no more than the model's trained context,
    :func:`offered`); then, with the context at its top, as many slots as fit.
    None when the backend declares neither range.

    estimated: ``profile`` is the prior read from this source (the reason says
        so, with the figure at the chosen context). minimum: the start steps
        down after one that ran out of memory: the context is the minimum.
    """
    if spec.context is None and spec.parallel is None:
        return None
    span = capped = offered(spec)
    if span is not None and minimum:
        span = (span[0], span[0])
    context = context_of(span, profile, gpus)
    parallel = parallel_of(spec.parallel, profile, gpus)
    why: list[str] = []
    context_top = True
    if span is not None and spec.context is not None:
        assert context is not None
        grown = grow(span, profile, gpus, margin, free, parallel)
        if minimum:
            why.append(reasons.context_stepped_down(span[0], spec.context))
        elif grown is None:
            why.append(reasons.context_fixed(context, span, profile is None))
        else:
            context = grown[0]
            context_top = context == span[1]
            why.append(reasons.context_chosen(context, span))
        if capped is not None and capped[1] < spec.context[1]:
            why.append(reasons.trained_cap(capped[1], spec.context))
    if spec.parallel is not None:
        assert parallel is not None
        more = grow_slots(spec.parallel, profile, gpus, margin, free, context)
        if more is None:
            why.append(reasons.parallel_fixed(parallel, spec.parallel, profile is None))
        elif not context_top:
            why.append(reasons.parallel_after_context(parallel, spec.parallel))
        else:
            parallel = more[0]
            why.append(reasons.parallel_chosen(parallel, spec.parallel))
    need = need_at(profile, gpus, margin, context, parallel)
    if estimated is not None and profile is not None:
        device = gpus[0] if gpus else HOST
        figures = at(profile, context, parallel)
        held = figures.gpu_bytes if gpus else figures.host_bytes
        why.append(reasons.estimated(estimated, held, context, device))
    return Choice(context=context, parallel=parallel, need=need, why="; ".join(why))


def path_ends(
    context: tuple[int, int] | None, parallel: tuple[int, int] | None
) -> list[tuple[int | None, int | None]]:
    """The (context, slots) where ``yard probe`` measures: each range's ends
    along the path starts are chosen on, ``(min, pmin)``, ``(max, pmin)``,
    then ``(max, pmax)`` (the token slope at the fewest slots, the slot slope at
    the largest context); one point ``(None, None)`` without ranges."""
    points: list[tuple[int | None, int | None]] = []
    low = parallel[0] if parallel is not None else None
    for c in context or (None,):
        points.append((c, low))
    if parallel is not None and parallel[1] != parallel[0]:
        points.append((context[1] if context is not None else None, parallel[1]))
    if context is not None and context[0] == context[1]:
        points = list(dict.fromkeys(points))
    return points


def learn(old: Profile | None, new: Profile) -> Profile:
    """``new`` (one measured point), with slopes from ``old`` where ``new``
    brings none: a setting's slope is the line through both points when they
    differ in that setting alone, else ``old``'s. Slopes are never negative (a
    smaller footprint at a larger setting is noise)."""
    if old is None:
        return new
    learned = new
    same_context = old.context == new.context
    same_parallel = old.parallel == new.parallel
    if new.context is not None and new.host_per_token is None and new.gpu_per_token is None:
        if old.context is not None and not same_context and same_parallel:
            span = new.context - old.context
            learned = replace(
                learned,
                gpu_per_token=max(0.0, (new.gpu_bytes - old.gpu_bytes) / span),
                host_per_token=max(0.0, (new.host_bytes - old.host_bytes) / span),
            )
        elif old.context is not None:
            learned = replace(
                learned, gpu_per_token=old.gpu_per_token, host_per_token=old.host_per_token
            )
    if new.parallel is not None and new.host_per_slot is None and new.gpu_per_slot is None:
        if old.parallel is not None and not same_parallel and same_context:
            slots = new.parallel - old.parallel
            learned = replace(
                learned,
                gpu_per_slot=max(0.0, (new.gpu_bytes - old.gpu_bytes) / slots),
                host_per_slot=max(0.0, (new.host_bytes - old.host_bytes) / slots),
            )
        elif old.parallel is not None:
            learned = replace(
                learned, gpu_per_slot=old.gpu_per_slot, host_per_slot=old.host_per_slot
            )
    return learned


def at(profile: Profile, context: int | None, parallel: int | None = None) -> Profile:
    """The same lines, their figures given at ``context`` and ``parallel``
    (``profile`` itself when there is nothing to move: no setting, no range,
    no slope)."""
    gpu, host = float(profile.gpu_bytes), float(profile.host_bytes)
    moved = profile
    tokens = _delta(context, profile.context, profile.gpu_per_token, profile.host_per_token)
    if tokens is not None:
        gpu += (profile.gpu_per_token or 0.0) * tokens
        host += (profile.host_per_token or 0.0) * tokens
        moved = replace(moved, context=context)
    slots = _delta(parallel, profile.parallel, profile.gpu_per_slot, profile.host_per_slot)
    if slots is not None:
        gpu += (profile.gpu_per_slot or 0.0) * slots
        host += (profile.host_per_slot or 0.0) * slots
        moved = replace(moved, parallel=parallel)
    if moved is profile:
        return profile
    return replace(moved, gpu_bytes=max(0, round(gpu)), host_bytes=max(0, round(host)))


def _delta(
    value: int | None, anchor: int | None, gpu_slope: float | None, host_slope: float | None
) -> int | None:
    """How far ``value`` is from the profile's ``anchor`` along a line it
    knows (None: no move)."""
    if value is None or anchor is None or value == anchor:
        return None
    if gpu_slope is None and host_slope is None:
        return None
    return value - anchor
