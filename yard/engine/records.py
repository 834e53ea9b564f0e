"""The engine's records: the :class:`Policy` it drives, what it reports
(:class:`LoggedDecision`, :class:`EngineStatistics`) and its own record of one
backend process (:class:`BackendRecord`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import trio

from yard.core.decisions import Decision
from yard.core.events import Event
from yard.core.spec import Profile
from yard.core.views import QueuedView, Snapshot
from yard.errors import Rejected
from yard.ports import BackendProcess, DeviceReading


class Policy(Protocol):
    """What the engine needs from a scheduler. :class:`yard.core.Scheduler` is one; the
    simulator's baseline policies (``sim.baselines``) are others, driven by the same
    engine so that comparisons differ only in the policy."""

    def handle(self, event: Event, now: float) -> list[Decision]: ...

    def next_wakeup(self) -> float | None: ...

    def snapshot(self, now: float, limit: int = 200) -> Snapshot: ...

    def explain(self, request_id: str, now: float) -> QueuedView | None: ...

    def profile(self, backend: str) -> Profile | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggedDecision:
    """A decision and the engine time it was made at."""

    at: float
    decision: Decision


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStatistics:
    """A snapshot of the engine's counters and gauges (for ``/metrics`` and the
    dashboard).

    requests: requests ended, by outcome: ``ok``, ``error`` (reported by the holder),
        ``rejected`` (by the core), ``cancelled`` (by the client).
    submitted: requests handed to :meth:`Engine.submit`.
    loads: backend starts ordered; load_failures: starts that never became ready.
    stops: backend stops ordered; evictions: stops ordered while requests waited
        (a stop to make room, as opposed to an idle timeout or an operator's unload).
    ooms: backends that died or failed to start with signs of out-of-memory.
    requeues: requests put back in the queue after a self-caused out-of-memory.
    deadline_misses: requests ended with ``deadline_missed``.
    rejects: rejections by error code.
    queue_length: requests waiting (queued, or between a lost upstream and the core's
        verdict); inflight: requests dispatched and not yet reported.
    backends_running: backend processes the engine holds (starting, ready, stopping).
    events, decisions: how many the loop has handled and carried out.
    queued_by_app, inflight_by_app: queue_length and inflight by app (apps with
        none left out).
    refusals: requests refused or ended unserved, by app, then by code: the
        core's rejections and the engine's own ``app_queue_full``.
    """

    requests: Mapping[str, int]
    submitted: int
    loads: int
    load_failures: int
    stops: int
    evictions: int
    ooms: int
    requeues: int
    deadline_misses: int
    rejects: Mapping[str, int]
    queue_length: int
    inflight: int
    backends_running: int
    events: int
    decisions: int
    queued_by_app: Mapping[str, int] = field(default_factory=dict)
    inflight_by_app: Mapping[str, int] = field(default_factory=dict)
    refusals: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


class BackendRecord:
    """The engine's record of one backend process it started."""

    __slots__ = (
        "context",
        "gpus",
        "launched_at",
        "measure",
        "name",
        "parallel",
        "peaks",
        "process",
        "ready",
        "scope",
        "stop_requested",
    )

    def __init__(
        self,
        name: str,
        gpus: tuple[str, ...],
        measure: bool,
        context: int | None = None,
        parallel: int | None = None,
    ) -> None:
        self.name = name
        self.gpus = gpus
        self.measure = measure
        # The context size and slot count the core chose (optional resources).
        self.context = context
        self.parallel = parallel
        self.process: BackendProcess | None = None
        self.stop_requested = False
        self.ready = False
        self.scope: trio.CancelScope | None = None
        self.launched_at = 0.0
        # Peak bytes per device while a first load is being measured.
        self.peaks: dict[str, int] = {}


def track_peaks(record: BackendRecord, readings: list[DeviceReading]) -> None:
    """Raise ``record``'s per-device peaks to what ``readings`` show it using."""
    peaks = record.peaks
    for reading in readings:
        used = reading.backends.get(record.name)
        if used is not None and used > peaks.get(reading.device, 0):
            peaks[reading.device] = used


def shutting_down() -> Rejected:
    """The refusal of a request that meets yard stopping."""
    return Rejected(
        status=503,
        code="shutting_down",
        message="yard is shutting down; try again once it is back",
        retry_after_s=5.0,
    )
