"""A small harness so each core test reads in three lines (h11's ConnectionPair idea).

``Harness`` owns a :class:`Scheduler`, a clock it moves by hand, and the log of
every decision. Helper methods feed the usual events; the returned decisions
are also filtered by kind for quick asserts.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from typing import TypeVar

from yard.core import (
    HOST,
    BackendExited,
    BackendReady,
    BackendSpec,
    BackendStartFailed,
    BackendStopped,
    Decision,
    DeviceSpec,
    Dispatch,
    Event,
    Flag,
    MemoryMeasured,
    ProfileMeasured,
    Reject,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    Requeue,
    Scheduler,
    SchedulerConfig,
    StartBackend,
    StopBackend,
    Tick,
)
from yard.core.events import Outcome

GIB = 1024**3

D = TypeVar("D", bound=Decision)


def gpu(
    name: str = "gpu0", gib: float = 24, reserve_gib: float = 0, exclusive: bool = False
) -> DeviceSpec:
    return DeviceSpec(
        name=name,
        kind="gpu",
        total_bytes=int(gib * GIB),
        reserve_bytes=int(reserve_gib * GIB),
        exclusive=exclusive,
    )


def host(gib: float = 64, reserve_gib: float = 0) -> DeviceSpec:
    return DeviceSpec(
        name=HOST, kind="host", total_bytes=int(gib * GIB), reserve_bytes=int(reserve_gib * GIB)
    )


def of(kind: type[D], decisions: Sequence[Decision]) -> list[D]:
    return [d for d in decisions if isinstance(d, kind)]


class Harness:
    """A scheduler, a hand-moved clock and the decision log."""

    def __init__(
        self,
        backends: Sequence[BackendSpec],
        devices: Sequence[DeviceSpec] = (),
        config: SchedulerConfig | None = None,
        profiles: dict[str, tuple[float, float, float]] | None = None,
    ) -> None:
        """profiles: backend -> (gpu GiB, host GiB, load_s), fed as stored profiles."""
        self.s = Scheduler(devices or (gpu(), host()), backends, config or SchedulerConfig())
        self.now = 0.0
        self.log: list[tuple[float, Decision]] = []
        for name, (g, h, load) in (profiles or {}).items():
            self.feed(
                ProfileMeasured(
                    backend=name,
                    gpu_bytes=int(g * GIB),
                    host_bytes=int(h * GIB),
                    load_s=load,
                    source="stored",
                )
            )

    def feed(self, event: Event, at: float | None = None) -> list[Decision]:
        if at is not None:
            assert at >= self.now, "time runs forward"
            self.now = at
        out = self.s.handle(event, self.now)
        self.log.extend((self.now, d) for d in out)
        return out

    # -- events in three words ---------------------------------------------------

    def arrive(
        self,
        rid: str,
        backend: str,
        priority: float = 50,
        at: float | None = None,
        *,
        start_by: float | None = None,
        allow_late: bool = False,
        arrived_at: float | None = None,
        requeued: bool = False,
        app: str = "",
    ) -> list[Decision]:
        event = RequestArrived(
            request_id=rid,
            backend=backend,
            priority=priority,
            start_by=start_by,
            allow_late=allow_late,
            arrived_at=arrived_at,
            requeued=requeued,
            app=app,
        )
        return self.feed(event, at)

    def ready(self, backend: str, at: float | None = None) -> list[Decision]:
        return self.feed(BackendReady(backend=backend), at)

    def stopped(self, backend: str, at: float | None = None) -> list[Decision]:
        return self.feed(BackendStopped(backend=backend), at)

    def finish(
        self, rid: str, at: float | None = None, outcome: Outcome = "ok", detail: str = ""
    ) -> list[Decision]:
        return self.feed(RequestFinished(request_id=rid, outcome=outcome, detail=detail), at)

    def cancel(self, rid: str, at: float | None = None) -> list[Decision]:
        return self.feed(RequestCancelled(request_id=rid), at)

    def exited(
        self, backend: str, at: float | None = None, oom: bool = False, code: int | None = 1
    ) -> list[Decision]:
        return self.feed(BackendExited(backend=backend, exit_code=code, oom=oom), at)

    def start_failed(
        self, backend: str, at: float | None = None, oom: bool = False, detail: str = "boom"
    ) -> list[Decision]:
        return self.feed(BackendStartFailed(backend=backend, detail=detail, oom=oom), at)

    def memory(
        self, device: str, used_gib: float, at: float | None = None, **backends: float
    ) -> list[Decision]:
        return self.feed(
            MemoryMeasured(
                device=device,
                used_bytes=int(used_gib * GIB),
                backends=tuple((k, int(v * GIB)) for k, v in backends.items()),
            ),
            at,
        )

    def tick(self, at: float) -> list[Decision]:
        return self.feed(Tick(), at)

    def load(
        self, backend: str, rid: str, at: float | None = None, priority: float = 50
    ) -> list[Decision]:
        """A request arrives and its backend becomes ready: the usual warm-up."""
        self.arrive(rid, backend, priority, at=at)
        return self.ready(backend)

    def play(
        self,
        arrivals: Sequence[tuple[float, Event]],
        service_s: Mapping[str, float],
        until: float,
        stop_s: float = 1.0,
    ) -> None:
        """Play the engine until ``until``: feed the arrivals at their times, and
        carry out every decision (a start is ready after the profile's load time,
        a dispatch finishes after its service time, a stop completes after
        ``stop_s``), with a Tick at each ``next_wakeup()``."""
        seq = itertools.count()
        pending: list[tuple[float, int, Event]] = [(t, next(seq), e) for t, e in arrivals]
        heapq.heapify(pending)

        def carry_out(decisions: list[Decision]) -> None:
            for d in decisions:
                if isinstance(d, StartBackend):
                    profile = self.s.profile(d.backend)
                    load = profile.load_s if profile is not None else 1.0
                    later(load, BackendReady(backend=d.backend))
                elif isinstance(d, StopBackend):
                    later(stop_s, BackendStopped(backend=d.backend))
                elif isinstance(d, Dispatch):
                    later(service_s[d.request_id], RequestFinished(request_id=d.request_id))

        def later(delay: float, event: Event) -> None:
            heapq.heappush(pending, (self.now + delay, next(seq), event))

        while True:
            wake = self.s.next_wakeup()
            nxt = pending[0][0] if pending else None
            times = [t for t in (wake, nxt) if t is not None and t <= until]
            if not times:
                return
            t = max(self.now, min(times))
            if nxt is not None and nxt <= t:
                _, _, event = heapq.heappop(pending)
                carry_out(self.feed(event, t))
            else:
                carry_out(self.feed(Tick(), t))

    def dispatch_times(self) -> list[tuple[float, str]]:
        return [(t, d.request_id) for t, d in self.log if isinstance(d, Dispatch)]

    # -- what came out -----------------------------------------------------------

    def state(self, backend: str) -> str:
        return next(b.state for b in self.s.snapshot(self.now).backends if b.name == backend)

    def decisions(self, kind: type[D]) -> list[D]:
        return [d for _, d in self.log if isinstance(d, kind)]

    def dispatched(self) -> list[str]:
        return [d.request_id for d in self.decisions(Dispatch)]

    def started(self) -> list[str]:
        return [d.backend for d in self.decisions(StartBackend)]

    def stops(self) -> list[str]:
        return [d.backend for d in self.decisions(StopBackend)]

    def rejected(self) -> dict[str, Reject]:
        return {d.request_id: d for d in self.decisions(Reject)}

    def requeued(self) -> list[str]:
        return [d.request_id for d in self.decisions(Requeue)]

    def flags(self) -> list[Flag]:
        return self.decisions(Flag)
