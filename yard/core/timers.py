"""The core's timers: what must happen at a later time, in one heap.

A timer names its kind, the backend or request it is for, and a token (the
request's generation, the backend's idle token). Timers are never removed when
they stop mattering; the scheduler tells, when one comes due, whether it is
still live (the request is still queued in the same generation, the backend is
still idle since the same moment), and a dead one is dropped.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum


class Timer(Enum):
    """What a timer is for."""

    IDLE = "idle"
    """A ready backend with nothing to do reaches its ``idle_ttl_s`` (key: backend)."""
    URGENT = "urgent"
    """A request's start-by comes near: it becomes urgent (key: request)."""
    DEADLINE = "deadline"
    """A request's start-by passes while it waits (key: request)."""
    LOST = "lost"
    """A request whose upstream broke got no exit report in time (key: request)."""
    HOLD = "hold"
    """A held request's not-before comes: it joins the queue (key: request)."""
    AHEAD = "ahead"
    """A window of work ahead becomes near enough to load for (key: backend)."""
    CLOSE = "close"
    """An announcement's window closes (key: announcement)."""


@dataclass(frozen=True, slots=True)
class Due:
    """One timer that came due."""

    kind: Timer
    key: str
    token: int


_Entry = tuple[float, int, Timer, str, int]
Live = Callable[[Timer, str, int], bool]


@dataclass(slots=True)
class Timers:
    """A heap of timers, earliest first (ties: the order they were set)."""

    _heap: list[_Entry] = field(default_factory=list)
    _seq: Iterator[int] = field(default_factory=itertools.count)

    def set(self, at: float, kind: Timer, key: str, token: int) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), kind, key, token))

    def next(self, live: Live) -> float | None:
        """When the earliest live timer is due (dead ones are dropped)."""
        heap = self._heap
        while heap and not live(heap[0][2], heap[0][3], heap[0][4]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def any_due(self, now: float) -> bool:
        """Whether a timer, live or not, is due by ``now`` (:meth:`due` yields
        none otherwise)."""
        heap = self._heap
        return bool(heap) and heap[0][0] <= now

    def due(self, now: float, live: Live) -> Iterator[Due]:
        """The live timers due by ``now``, earliest first. Liveness is asked as
        each comes up, so handling one may kill the ones after it."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, kind, key, token = heapq.heappop(heap)
            if live(kind, key, token):
                yield Due(kind, key, token)
