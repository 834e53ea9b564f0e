"""Optional resources: a backend's context size, chosen at each start.

A backend may declare a range for a setting that changes its memory, the
context size (``BackendSpec.context``: min, max). Its memory is learned as a
line in that setting, per device: ``bytes(c) = bytes(c0) + per_token x (c - c0)``,
through a measured point ``c0`` (``Profile.context``) with a slope learned from
a second point (``Profile.gpu_per_token``, ``host_per_token``). For
llama-server that is a fixed part (weights, buffers) plus the KV cache, which
grows by the same bytes for every token of context.

Rules
-----

- The *required* part is the memory at the minimum: a backend is placed (and
  room made for it) by that need alone. At the start itself it gets the
  largest context that fits in what is free on each of its devices, down to
  the minimum, in steps of :data:`STEP` tokens; room is never made for the
  optional part.
- A first load (no profile) starts at the maximum, the worst case, and is
  measured there.
- With one point and no slope, the backend starts at the measured context,
  which is all that is known (memory grows with the context, so it is a safe
  bound for smaller ones only); a second measured point at another context
  (``yard probe`` measures both ends) gives the slope.

Pure functions of their arguments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from yard.core.spec import HOST, Profile

STEP = 256
"""Contexts are chosen in multiples of this many tokens (llama.cpp pads its
context to 256), or the range's minimum."""


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


def has_slope(profile: Profile, gpus: tuple[str, ...]) -> bool:
    """Whether the profile knows how its memory grows with the context (on
    the host, and on the GPUs when it has any)."""
    if profile.host_per_token is None:
        return False
    return not gpus or profile.gpu_per_token is not None


def need_at(
    profile: Profile | None, gpus: tuple[str, ...], margin: float, context: int | None
) -> dict[str, int]:
    """The reservation (figures x ``margin``) on each device of a placement on
    ``gpus`` at ``context`` (0s while unmeasured)."""
    if profile is None:
        need = dict.fromkeys(gpus, 0)
        need[HOST] = 0
        return need
    gpu_bytes, host_bytes = float(profile.gpu_bytes), float(profile.host_bytes)
    if context is not None and profile.context is not None and context != profile.context:
        delta = context - profile.context
        gpu_bytes += (profile.gpu_per_token or 0.0) * delta
        host_bytes += (profile.host_per_token or 0.0) * delta
    need = {g: math.ceil(max(0.0, gpu_bytes) * margin) for g in gpus}
    need[HOST] = math.ceil(max(0.0, host_bytes) * margin)
    return need


def grow(
    context: tuple[int, int] | None,
    profile: Profile | None,
    gpus: tuple[str, ...],
    margin: float,
    free: Mapping[str, int],
) -> tuple[int, dict[str, int]] | None:
    """The largest context that fits in ``free`` (per device) and its need,
    from the required one up; None when the backend has no choice to make
    (no range, no profile, or no slope)."""
    if context is None or profile is None or profile.context is None:
        return None
    if not has_slope(profile, gpus):
        return None
    low, high = context
    at_low = need_at(profile, gpus, margin, low)
    cap = high
    # Each device's need is a line in the context: the largest fitting one is
    # found per device, then the smallest of those taken.
    for device, room in free.items():
        per_token = profile.host_per_token if device == HOST else profile.gpu_per_token
        slope = (per_token or 0.0) * margin
        if slope > 0 and device in at_low:
            cap = min(cap, low + math.floor((room - at_low[device]) / slope))
    best = high if cap >= high else max(low, cap // STEP * STEP)
    return best, need_at(profile, gpus, margin, best)


def learn(old: Profile | None, new: Profile) -> Profile:
    """``new`` (one measured point), with a slope from ``old`` where ``new``
    brings none: the line through both points when they were measured at
    different contexts, else ``old``'s slope. Slopes are never negative (a
    smaller footprint at a larger context is noise)."""
    if new.context is None or old is None or old.context is None:
        return new
    if new.gpu_per_token is not None or new.host_per_token is not None:
        return new
    if old.context == new.context:
        return replace(new, gpu_per_token=old.gpu_per_token, host_per_token=old.host_per_token)
    span = new.context - old.context
    return replace(
        new,
        gpu_per_token=max(0.0, (new.gpu_bytes - old.gpu_bytes) / span),
        host_per_token=max(0.0, (new.host_bytes - old.host_bytes) / span),
    )


def at(profile: Profile, context: int | None) -> Profile:
    """The same line, its figures given at ``context`` (``profile`` itself
    when there is nothing to move: no context, no range, no slope)."""
    if context is None or profile.context is None or context == profile.context:
        return profile
    if profile.gpu_per_token is None and profile.host_per_token is None:
        return profile
    delta = context - profile.context
    return replace(
        profile,
        gpu_bytes=max(0, round(profile.gpu_bytes + (profile.gpu_per_token or 0.0) * delta)),
        host_bytes=max(0, round(profile.host_bytes + (profile.host_per_token or 0.0) * delta)),
        context=context,
    )
