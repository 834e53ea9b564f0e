"""Read-only views of the scheduler for the dashboard, the jobs API and ``yard status``.

They are snapshots: plain frozen records built on request, never live objects.
The functions at the end build them from the scheduler's records; the
scheduler's ``explain`` and ``snapshot`` call them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from yard.core import estimates, reasons
from yard.core.lifecycle import LOADED, OCCUPYING, BackendState
from yard.core.queue import Req, order_key
from yard.core.records import Backend, Device
from yard.core.spec import DeviceKind, Prior, Profile, SchedulerConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedView:
    """One waiting request.

    effective_priority: base + aging (+ the deadline boost once urgent), now.
    position: 0 = the next to be dispatched among the requests for its backend
        (snapshots list requests in dispatch order across backends).
    reason: why it still waits, for a person.
    estimated_start: engine-clock time it should start, if it can be guessed.
    """

    request_id: str
    backend: str
    app: str
    priority: float
    effective_priority: float
    arrived_at: float
    start_by: float | None
    position: int
    reason: str
    estimated_start: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendView:
    """One backend: its state (``stopped``, ``starting``, ``ready``, ``draining``,
    ``stopping``, ``failed``) and why it is in it.

    context, parallel, slots: what its running instance has: the context and
    slot count the server itself reported once ready (llama-server's
    ``/props``), else those yard chose. prior: the estimate read from its
    model file while it has no profile (None: measured, or no file).
    context_range: the context sizes it may start with (min, max; None: no
    range).
    """

    name: str
    state: str
    gpus: tuple[str, ...]
    inflight: int
    slots: int
    served: int
    loaded_at: float | None
    pinned: bool
    profile: Profile | None
    last_load_s: float | None
    reason: str
    queued: int = 0
    context: int | None = None
    parallel: int | None = None
    prior: Prior | None = None
    context_range: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceView:
    """One memory pool.

    committed_bytes: reservations (profile x margin) of loaded and loading backends.
    live_bytes: the latest measured bytes per backend.
    foreign_bytes: used by processes yard does not own (latest reading).
    free_bytes: usable - max(committed, live) per backend - foreign, never negative.
    per_process: the meter tells backends apart here (False: device deltas, or
        not known; a first load there goes alone).
    """

    name: str
    kind: DeviceKind
    total_bytes: int
    reserve_bytes: int
    committed_bytes: int
    live_bytes: dict[str, int] = field(default_factory=dict)
    foreign_bytes: int = 0
    free_bytes: int = 0
    exclusive: bool = False
    per_process: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowView:
    """One window of work ahead: a held request or an announcement.

    kind: ``held`` (a request or job with a not-before) or ``announced``.
    id: the announcement's id, or ``held:<request id>``.
    opens, closes: engine times (a held request's window closes when it opens).
    left: requests still expected (a held request: 1).
    loads_from: when the core starts counting it for a load ahead (opens minus
        the measured load time and the lead margin; for an announcement whose
        load may wait for busy work to drain, that much earlier: it is urgent
        from then).
    label: how people read ``opens`` ("13:50:00Z"), or empty.
    """

    id: str
    kind: str
    app: str
    backend: str
    opens: float
    closes: float
    priority: float
    left: int
    loads_from: float
    label: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """The whole scheduler at one moment. ``queue`` is in dispatch order and
    holds at most the ``limit`` asked for; ``queue_length`` counts them all.
    ``windows``: the work ahead, by opening time (policies without windows
    leave it empty)."""

    now: float
    devices: tuple[DeviceView, ...]
    backends: tuple[BackendView, ...]
    queue: tuple[QueuedView, ...]
    queue_length: int
    windows: tuple[WindowView, ...] = ()


# -- building them ------------------------------------------------------------------

StartCost = Callable[[Backend, float], float]
"""Seconds until a request for the backend could start if it went first, at ``now``."""


def waiting_reason(
    req: Req,
    b: Backend,
    swap_head: Req | None,
    config: SchedulerConfig,
    now: float,
    ahead: int,
    start_cost: StartCost,
) -> str:
    """Why ``req`` (for ``b``) still waits, behind ``ahead`` requests for ``b``.
    ``swap_head``: the request whose swap will evict ``b``, if any."""
    before = reasons.behind(ahead, b.name)
    if b.state is BackendState.READY:
        if swap_head is not None and swap_head.overtakes >= config.batch_bound:
            return before + reasons.held_back(
                b.name, swap_head.backend, swap_head.id, config.batch_bound
            )
        if b.free_slots() <= 0:
            return before + reasons.waiting_for_slot(
                b.name, len(b.running), b.slots, estimates.service_est(b, config)
            )
        return before + f"about to be dispatched to {b.name}"
    if b.state is BackendState.STARTING:
        cost = start_cost(b, now)
        loading = f"; loading: {b.loading}" if b.loading else ""
        return before + f"waiting for {b.name} to load (est. {reasons.secs(cost)}{loading})"
    if b.state is BackendState.DRAINING:
        return before + f"waiting: {b.name} is draining ({b.reason})"
    if b.state is BackendState.STOPPING:
        return before + f"waiting: {b.name} is stopping ({b.reason}); it loads again after"
    return before + (b.wait_reason or f"waiting for {b.name} to be loaded")


def dispatch_order(backends: Iterable[Backend], boost: float) -> list[Req]:
    """Every waiting request in dispatch order across backends (a merge of the
    per-backend orders)."""
    lists = [b.queue.ordered() for b in backends if b.queue.size]
    idx = [0] * len(lists)
    out: list[Req] = []
    while True:
        best = -1
        for i, lst in enumerate(lists):
            if idx[i] < len(lst) and (
                best < 0 or order_key(lst[idx[i]], boost) < order_key(lists[best][idx[best]], boost)
            ):
                best = i
        if best < 0:
            return out
        out.append(lists[best][idx[best]])
        idx[best] += 1


def queued_view(
    req: Req,
    b: Backend,
    swap_head: Req | None,
    config: SchedulerConfig,
    position: int,
    ahead: int,
    now: float,
    start_cost: StartCost,
    costs: dict[str, float],
) -> QueuedView:
    """One waiting request; ``costs`` caches start costs per backend for one view."""
    if b.name not in costs:
        costs[b.name] = start_cost(b, now)
    est = now + costs[b.name] + ahead * estimates.service_est(b, config) / b.slots
    return QueuedView(
        request_id=req.id,
        backend=req.backend,
        app=req.app,
        priority=req.priority,
        effective_priority=req.effective(now, config.aging_rate, config.deadline_boost),
        arrived_at=req.arrived_at,
        start_by=req.start_by,
        position=position,
        reason=waiting_reason(req, b, swap_head, config, now, ahead, start_cost),
        estimated_start=est,
    )


def device_view(dev: Device, occupants: Iterable[Backend]) -> DeviceView:
    occ = list(occupants)
    d = dev.name
    held = sum(o.held(d) for o in occ)
    return DeviceView(
        name=d,
        kind=dev.spec.kind,
        total_bytes=dev.spec.total_bytes,
        reserve_bytes=dev.spec.reserve_bytes,
        committed_bytes=sum(o.reserved.get(d, 0) for o in occ),
        live_bytes={o.name: o.live[d] for o in occ if d in o.live},
        foreign_bytes=dev.foreign,
        free_bytes=max(0, dev.spec.usable_bytes - held - dev.foreign),
        exclusive=dev.spec.exclusive,
        per_process=dev.spec.per_process,
    )


def backend_view(b: Backend, profile: Profile | None) -> BackendView:
    waiting = b.wait_reason and b.queue.size and b.state not in OCCUPYING
    return BackendView(
        name=b.name,
        state=b.state.value,
        gpus=b.gpus if b.state in OCCUPYING else (),
        inflight=len(b.running),
        slots=b.slots,
        served=b.served,
        loaded_at=b.ready_at if b.state in LOADED else None,
        pinned=b.pinned,
        profile=profile,
        last_load_s=b.learned_load_s,
        reason=_reason(b, bool(waiting)),
        queued=b.queue.size,
        context=(b.served_context or b.context) if b.state in OCCUPYING else None,
        parallel=b.parallel if b.state in OCCUPYING else None,
        prior=b.spec.prior if b.profile is None else None,
        context_range=b.spec.context,
    )


def _reason(b: Backend, waiting: bool) -> str:
    if waiting:
        return f"{b.reason}; {b.queue.size} waiting: {b.wait_reason}"
    if b.state is BackendState.STARTING and b.loading:
        return f"{b.reason}; {b.loading}"
    return b.reason


def positions(ordered: list[Req]) -> tuple[dict[str, int], dict[str, int]]:
    """Each request's place in ``ordered`` and among the requests for its backend."""
    overall: dict[str, int] = {}
    within: dict[str, int] = {}
    counts: dict[str, int] = {}
    for i, r in enumerate(ordered):
        overall[r.id] = i
        n = counts.get(r.backend, 0)
        within[r.id] = n
        counts[r.backend] = n + 1
    return overall, within


__all__ = [
    "BackendView",
    "DeviceView",
    "QueuedView",
    "Snapshot",
    "WindowView",
    "backend_view",
    "device_view",
    "dispatch_order",
    "positions",
    "queued_view",
    "waiting_reason",
]
