"""A fake engine for the observability tests: the read side of
``yard.engine.Engine`` over views the test sets, plus what admin calls sent."""

from __future__ import annotations

from dataclasses import replace

import trio

from yard.core.decisions import Decision
from yard.core.events import Event
from yard.core.spec import DeviceKind, Profile
from yard.core.views import BackendView, DeviceView, QueuedView, Snapshot
from yard.engine import EngineStatistics, LoggedDecision

GiB = 2**30


def backend_view(name: str, **changes: object) -> BackendView:
    """A stopped backend with one slot, changed by ``changes``."""
    view = BackendView(
        name=name,
        state="stopped",
        gpus=(),
        inflight=0,
        slots=1,
        served=0,
        loaded_at=None,
        pinned=False,
        profile=None,
        last_load_s=None,
        reason="not needed",
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def device_view(name: str = "gpu0", **changes: object) -> DeviceView:
    """An empty 24 GiB GPU with 1 GiB kept free, changed by ``changes``."""
    kind: DeviceKind = "host" if name == "host" else "gpu"
    view = DeviceView(
        name=name,
        kind=kind,
        total_bytes=24 * GiB,
        reserve_bytes=1 * GiB,
        committed_bytes=0,
        free_bytes=23 * GiB,
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def queued_view(request_id: str, backend: str, **changes: object) -> QueuedView:
    view = QueuedView(
        request_id=request_id,
        backend=backend,
        app="",
        priority=50.0,
        effective_priority=50.0,
        arrived_at=0.0,
        start_by=None,
        position=0,
        reason="waiting for its backend to load",
        estimated_start=None,
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def statistics(**changes: object) -> EngineStatistics:
    stats = EngineStatistics(
        requests={},
        submitted=0,
        loads=0,
        load_failures=0,
        stops=0,
        evictions=0,
        ooms=0,
        requeues=0,
        deadline_misses=0,
        rejects={},
        queue_length=0,
        inflight=0,
        backends_running=0,
        events=0,
        decisions=0,
    )
    return replace(stats, **changes)  # type: ignore[arg-type]


class FakeEngine:
    """Serves whatever the test put in ``devices``, ``backends``, ``queue``,
    ``log``, ``logs`` and ``stats``; records ``send()`` calls in ``sent``."""

    def __init__(self) -> None:
        self.devices: list[DeviceView] = [device_view("host", total_bytes=64 * GiB)]
        self.backends: dict[str, BackendView] = {}
        self.queue: list[QueuedView] = []
        self.log: list[LoggedDecision] = []
        self.logs: dict[str, list[str]] = {}
        self.stats = statistics()
        self.sent: list[Event] = []
        self.subscribers: list[trio.MemorySendChannel[LoggedDecision]] = []

    def set_backend(self, name: str, **changes: object) -> None:
        base = self.backends.get(name) or backend_view(name)
        self.backends[name] = replace(base, **changes)  # type: ignore[arg-type]

    def decide(self, decision: Decision) -> LoggedDecision:
        """Log a decision now and feed it to the subscribers."""
        logged = LoggedDecision(at=self.now(), decision=decision)
        self.log.append(logged)
        for channel in list(self.subscribers):
            try:
                channel.send_nowait(logged)
            except (trio.WouldBlock, trio.BrokenResourceError):
                channel.close()
                self.subscribers.remove(channel)
        return logged

    def now(self) -> float:
        return trio.current_time()

    def snapshot(self, limit: int = 200) -> Snapshot:
        return Snapshot(
            now=self.now(),
            devices=tuple(self.devices),
            backends=tuple(self.backends.values()),
            queue=tuple(self.queue[:limit]),
            queue_length=len(self.queue),
        )

    def explain(self, request_id: str) -> QueuedView | None:
        return next((q for q in self.queue if q.request_id == request_id), None)

    def decisions(self) -> list[LoggedDecision]:
        return list(self.log)

    def subscribe(self) -> trio.MemoryReceiveChannel[LoggedDecision]:
        send, receive = trio.open_memory_channel[LoggedDecision](16)
        self.subscribers.append(send)
        return receive

    def statistics(self) -> EngineStatistics:
        return self.stats

    def backend_log(self, backend: str) -> list[str]:
        return list(self.logs.get(backend, []))

    def send(self, event: Event) -> None:
        self.sent.append(event)


def profile(gpu_gib: float, host_gib: float, load_s: float) -> Profile:
    return Profile(gpu_bytes=int(gpu_gib * GiB), host_bytes=int(host_gib * GiB), load_s=load_s)
