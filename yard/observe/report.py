"""What yard shows about itself, as one JSON document.

The dashboard renders it, ``GET /admin/status`` returns it and ``yard status``
prints it, so the three always agree. It is built from the engine's read side
(``snapshot()``, ``decisions()``, ``statistics()``, ``backend_log()``) and the
configuration; building it changes nothing.

Times: the engine works on its own monotonic clock. The document carries both
the engine clock (``now``, ``at``) and what people read: ages in seconds
(``ago_s``, ``waited_s``, ``uptime_s``) and wall-clock epochs (``at_wall``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from yard import __version__
from yard.core.decisions import (
    Decision,
    Dispatch,
    Flag,
    Reject,
    Requeue,
    StartBackend,
    StopBackend,
)
from yard.core.spec import HOST

if TYPE_CHECKING:
    from yard.core.events import Event
    from yard.core.views import BackendView, DeviceView, QueuedView, Snapshot
    from yard.engine import EngineStatistics, LoggedDecision

Json = dict[str, Any]

DECISION_LIMIT = 60
"""Most recent decisions in the document."""

FAILURE_LIMIT = 10
"""Most recent failures in the document."""

LOG_TAIL = 12
"""Log lines shown with each failure."""

_FAILED_CODES = frozenset({"backend_failed", "start_failed", "backend_start_failed"})


class EngineSource(Protocol):
    """The part of ``yard.engine.Engine`` that observability reads and drives."""

    def now(self) -> float: ...

    def snapshot(self, limit: int = 200) -> Snapshot: ...

    def explain(self, request_id: str) -> QueuedView | None: ...

    def decisions(self) -> list[LoggedDecision]: ...

    def subscribe(self) -> trio.MemoryReceiveChannel[LoggedDecision]: ...

    def statistics(self) -> EngineStatistics: ...

    def backend_log(self, backend: str) -> list[str]: ...

    def send(self, event: Event) -> None: ...


def decision_kind(decision: Decision) -> str:
    """A short word for the decision's type, as the dashboard labels it."""
    match decision:
        case StartBackend():
            return "load"
        case StopBackend():
            return "stop"
        case Dispatch():
            return "dispatch"
        case Reject():
            return "reject"
        case Requeue():
            return "requeue"
        case Flag():
            return "flag"
    return type(decision).__name__.lower()


def is_failure(decision: Decision) -> bool:
    """Whether a decision reports something that went wrong on a backend:
    a request ended by a backend failure, or requeued after an OOM."""
    if isinstance(decision, Requeue):
        return True
    return isinstance(decision, Reject) and (
        decision.code in _FAILED_CODES or decision.status in (500, 502)
    )


def backend_display_state(view: BackendView) -> str:
    """The backend's state as people read it: ``busy`` is a ready backend
    with at least one request in flight."""
    if view.state == "ready" and view.inflight > 0:
        return "busy"
    return view.state


def _profile_json(view: BackendView) -> Json | None:
    if view.profile is None:
        return None
    return {
        "gpu_bytes": view.profile.gpu_bytes,
        "host_bytes": view.profile.host_bytes,
        "load_s": view.profile.load_s,
    }


def _holds_memory(view: BackendView) -> bool:
    return view.state not in ("stopped", "failed")


def _device_json(device: DeviceView, backends: Sequence[BackendView], margin: float) -> Json:
    shares: list[Json] = []
    for view in backends:
        on_device = device.name == HOST or device.name in view.gpus
        live = device.live_bytes.get(view.name)
        if not (on_device and _holds_memory(view)) and not live:
            continue
        profile_bytes: int | None = None
        if view.profile is not None:
            profile_bytes = (
                view.profile.host_bytes if device.kind == "host" else view.profile.gpu_bytes
            )
        reserved = int(profile_bytes * margin) if profile_bytes is not None else None
        shares.append(
            {
                "backend": view.name,
                "state": backend_display_state(view),
                "profile_bytes": profile_bytes,
                "reserved_bytes": reserved,
                "live_bytes": live or 0,
            }
        )
    return {
        "name": device.name,
        "kind": device.kind,
        "total_bytes": device.total_bytes,
        "reserve_bytes": device.reserve_bytes,
        "committed_bytes": device.committed_bytes,
        "foreign_bytes": device.foreign_bytes,
        "free_bytes": device.free_bytes,
        "live_bytes": sum(device.live_bytes.values()),
        "exclusive": device.exclusive,
        # Whether the meter tells backends apart here (False: by device deltas,
        # or not known; a first load there goes alone).
        "per_process": device.per_process,
        "backends": shares,
    }


def _backend_json(view: BackendView, now: float, models: Sequence[str]) -> Json:
    loaded = view.loaded_at is not None and view.state not in ("stopped", "failed")
    return {
        "name": view.name,
        "state": backend_display_state(view),
        "core_state": view.state,
        "models": list(models),
        "gpus": list(view.gpus),
        "inflight": view.inflight,
        "queued": view.queued,
        "slots": view.slots,
        "served": view.served,
        "loaded_at": view.loaded_at,
        "uptime_s": (now - view.loaded_at) if loaded and view.loaded_at is not None else None,
        "pinned": view.pinned,
        "profile": _profile_json(view),
        "last_load_s": view.last_load_s,
        "context": view.context,
        "context_range": list(view.context_range) if view.context_range else None,
        "parallel": view.parallel,
        "estimate": _estimate_json(view),
        "reason": view.reason,
    }


def _estimate_json(view: BackendView) -> Json | None:
    """The memory read from its model file while it was never measured."""
    if view.prior is None:
        return None
    p = view.prior.profile
    return {
        "gpu_bytes": p.gpu_bytes,
        "host_bytes": p.host_bytes,
        "at_context": p.context,
        "source": view.prior.source,
    }


def _queued_json(item: QueuedView, now: float) -> Json:
    return {
        "request_id": item.request_id,
        "backend": item.backend,
        "app": item.app,
        "priority": item.priority,
        "effective_priority": item.effective_priority,
        "arrived_at": item.arrived_at,
        "waited_s": now - item.arrived_at,
        "start_by": item.start_by,
        "deadline_in_s": (item.start_by - now) if item.start_by is not None else None,
        "position": item.position,
        "reason": item.reason,
        "estimated_start": item.estimated_start,
        "estimated_start_in_s": (
            max(0.0, item.estimated_start - now) if item.estimated_start is not None else None
        ),
    }


def decision_json(logged: LoggedDecision, now: float, wall_now: float) -> Json:
    """One logged decision, with its kind, age and the fields people filter on."""
    decision = logged.decision
    entry: Json = {
        "at": logged.at,
        "at_wall": wall_now - (now - logged.at),
        "ago_s": now - logged.at,
        "kind": decision_kind(decision),
        "type": type(decision).__name__,
        "reason": decision.reason,
        "backend": getattr(decision, "backend", None),
        "request_id": getattr(decision, "request_id", None),
    }
    if isinstance(decision, StartBackend):
        entry["gpus"] = list(decision.gpus)
        entry["measure"] = decision.measure
    if isinstance(decision, Reject):
        entry["status"] = decision.status
        entry["code"] = decision.code
        entry["message"] = decision.message
    return entry


def _failures(
    logged: Sequence[LoggedDecision],
    backends: Sequence[BackendView],
    engine: EngineSource,
    now: float,
    wall_now: float,
) -> list[Json]:
    # A rejected or requeued request names no backend; the dispatch before it does.
    dispatched_to: dict[str, str] = {}
    found: list[Json] = []
    for item in logged:
        decision = item.decision
        if isinstance(decision, Dispatch):
            dispatched_to[decision.request_id] = decision.backend
        elif is_failure(decision):
            entry = decision_json(item, now, wall_now)
            request_id = entry["request_id"]
            if entry["backend"] is None and isinstance(request_id, str):
                entry["backend"] = dispatched_to.get(request_id)
            found.append(entry)
    for view in backends:
        if view.state == "failed":
            found.append(
                {
                    "at": now,
                    "at_wall": wall_now,
                    "ago_s": 0.0,
                    "kind": "failed",
                    "type": "BackendFailed",
                    "reason": view.reason,
                    "backend": view.name,
                    "request_id": None,
                }
            )
    found = found[-FAILURE_LIMIT:]
    for entry in found:
        backend = entry["backend"]
        entry["log"] = engine.backend_log(backend)[-LOG_TAIL:] if isinstance(backend, str) else []
    found.reverse()
    return found


def _statistics_json(statistics: object) -> Json:
    if dataclasses.is_dataclass(statistics) and not isinstance(statistics, type):
        raw = dataclasses.asdict(statistics)
    else:
        raw = dict(vars(statistics))
    return {
        key: (dict(value) if isinstance(value, Mapping) else value) for key, value in raw.items()
    }


def apps_json(limits: Mapping[str, Json], statistics: Json) -> list[Json]:
    """Each app's limits (``limits``: name -> its ``models``, ``max_queued``,
    ``max_concurrent`` and ``weight`` from the configuration) with its
    requests waiting (``queued``) and being served (``inflight``) now and its
    refusals by code (``refused``), from the engine's statistics. Apps seen by
    the engine but not configured (``local``) come last, without limits."""
    queued = statistics.get("queued_by_app", {})
    inflight = statistics.get("inflight_by_app", {})
    refused = statistics.get("refusals", {})
    seen = [name for name in (*queued, *inflight, *refused) if name not in limits]
    return [
        {
            "name": name,
            **limits.get(name, {}),
            "queued": queued.get(name, 0),
            "inflight": inflight.get(name, 0),
            "refused": dict(refused.get(name, {})),
        }
        for name in (*limits, *dict.fromkeys(seen))
    ]


def build_status(
    engine: EngineSource,
    *,
    models: Mapping[str, Sequence[str]],
    profile_margin: float,
    started_at: float,
    queue_limit: int = 200,
    wall_now: float | None = None,
) -> Json:
    """Everything the dashboard shows, as JSON-ready data.

    models: backend name -> the model names it serves (from the configuration).
    profile_margin: the factor the scheduler applies to a measured profile to
        get a reservation (``SchedulerConfig.profile_margin``).
    started_at: wall-clock time yard started serving.
    queue_limit: most queued requests listed (``queue.length`` counts all).
    wall_now: the wall-clock time to report (default: ``time.time()``).
    """
    wall = time.time() if wall_now is None else wall_now
    snapshot = engine.snapshot(limit=queue_limit)
    now = snapshot.now
    logged = engine.decisions()
    devices = [_device_json(d, snapshot.backends, profile_margin) for d in snapshot.devices]
    backends = [_backend_json(b, now, models.get(b.name, ())) for b in snapshot.backends]
    return {
        "version": __version__,
        "now": now,
        "wall_time": wall,
        "started_at": started_at,
        "uptime_s": max(0.0, wall - started_at) if started_at else None,
        "host_only": not any(d.kind == "gpu" for d in snapshot.devices),
        "devices": devices,
        "backends": backends,
        "queue": {
            "length": snapshot.queue_length,
            "items": [_queued_json(q, now) for q in snapshot.queue],
        },
        "decisions": [decision_json(d, now, wall) for d in reversed(logged[-DECISION_LIMIT:])],
        "failures": _failures(logged, snapshot.backends, engine, now, wall),
        "profiles": [
            {"backend": b["name"], **b["profile"]} for b in backends if b["profile"] is not None
        ],
        "statistics": _statistics_json(engine.statistics()),
    }
