"""The scheduler: who goes first, what is loaded, what happens on failure.

``Scheduler.handle(event, now)`` is the only way its state changes; it returns
the decisions the engine must carry out, in order. It does no I/O and reads no
clock: the same events at the same times give the same decisions.

Rules it keeps
--------------

- Requests for one backend are dispatched in the order of
  :mod:`yard.core.queue` (priority with aging, urgent deadlines first), only
  to a ``ready`` backend with a free slot.
- An app with ``max_concurrent`` never has more requests dispatched (running,
  or lost awaiting the backend's exit report) at once: while it has that many,
  its waiting requests are passed over (the next request in the order that is
  not held goes) and say why they wait.
- Loads, evictions and swap batching follow :mod:`yard.core.placement` (its
  docstring states the rules): a backend starts only where it fits next to
  everything loaded, one load at a time per device; room is made by stopping
  the least needed idle backends, no more than needed, and busy ones are
  drained, never killed.
- yard never retries, except after an out-of-memory it caused itself: the
  requests that backend was serving go back once, to their old place.

Deadlines
---------

A request with ``start_by`` is refused at arrival (409 ``deadline_infeasible``,
with the earliest possible start) when even going first it could not start in
time: 0 if its backend is ready with a free slot, the expected service time if
it is busy, the rest of the load if it is loading, else its load time plus the
time to free memory (draining busy neighbours). A start-by up to 50 ms before
the arrival is handled counts as now (``X-Yard-Start-Within: 0``: the engine
time was taken a moment earlier). It becomes *urgent* at
``start_by - cost - urgency_window_s``, where ``cost`` is the worst case (a load
after its neighbours drain, each at the longest of its recent service times),
because a loaded backend may be evicted while the request waits. If
``start_by`` passes while it waits it ends with 504 ``deadline_missed``.
``allow_late`` turns both refusals into a ``Flag``.

Failures
--------

- A backend that exits on its own fails its in-flight requests with 502
  ``backend_failed`` (the exit detail in the message); it starts again only
  when a request needs it.
- A backend that fails to start fails the requests waiting for it (502, with
  the detail), so clients do not hang on a command that cannot start; the next
  request tries again.
- An out-of-memory is *self-caused* when yard had over-committed the device: a
  load ran next to it, a reading showed a backend above its profile or the
  device above its usable size, foreign memory appeared after placement, or
  (no reading caught it) yard had placed other backends on the same GPU. Its
  in-flight requests are requeued once (``Requeue``), its profile raised
  (``ProfileRaised``: at least +10%, the last live reading, and on a shared
  GPU more than was left for it there). A request requeued before gets 502.
- ``upstream_lost`` holds the slot for ``lost_grace_s`` waiting for the exit
  report; without one the request fails with 502.

What the engine must know: after ``Reject`` of a dispatched request, reports
about it are ignored; after ``Requeue`` the old attempt must not be reported
(once the request is dispatched again the core would take the report for the
new attempt). A ``StopBackend`` occupies memory until ``BackendStopped``; a
``BackendExited`` while stopping is ignored (the stop completes with
``BackendStopped``).

The wait bound
--------------

No request waits longer than
``W = T + (queue_limit + batch_bound + 1) * (max_load_s + max_service_s)``
with ``T = (max_priority - min_priority + deadline_boost) / aging_rate``, as long
as loads succeed, service times stay below ``max_service_s``, foreign memory
does not grow and every backend fits next to the pinned ones; a request whose
start-by passes ends there unless it allows lateness. The proof is in
``docs/wait-bound.md``; :meth:`Scheduler.wait_bound` computes ``W`` from the
current figures and the stateful tests check that no wait exceeds it. With app
weights (:mod:`yard.core.fairness`) ``T`` grows by ``share_points / aging_rate``.
Each announcement and held request near or open while a request waits adds its
window's term (:mod:`yard.core.windows`); ``wait_bound`` counts those too.

``max_concurrent`` is outside that proof. Passing over a held request adds no
one ahead of anybody else, so the argument for apps without the limit is
unchanged; a request of an app with ``max_concurrent = c`` may in addition
wait while its app's earlier requests are served, ``c`` at a time: up to about
``ceil(q / c) * max_service_s`` more, ``q`` being that app's requests ahead of it
(at most its ``max_queued``). The stateful tests do not check that figure;
``tests/core/test_app_concurrency.py`` checks that the limit holds and that
held requests are served in the end.

Layout
------

This module takes the events and runs the pass that follows each one
(``_pass``: plan loads, dispatch, settle). The rest lives beside it:
:mod:`~yard.core.state` (what the scheduler knows, and the moves its parts
share), :mod:`~yard.core.request_events` and :mod:`~yard.core.backend_events`
(what each event changes), :mod:`~yard.core.placement` (where a backend fits,
what must make room), :mod:`~yard.core.estimates` (load and service times,
start costs, batching slack), :mod:`~yard.core.failures` (self-caused
out-of-memory), :mod:`~yard.core.timers`, :mod:`~yard.core.reasons` (the
sentences) and :mod:`~yard.core.views` (the read-only records).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from yard.core import (
    backend_events,
    catalog,
    estimates,
    lending,
    placement,
    reasons,
    request_events,
    views,
    windows,
)
from yard.core.decisions import Decision, Dispatch, Flag
from yard.core.events import (
    AdminForgetProfile,
    AdminLoad,
    AdminPin,
    AdminUnload,
    AnnouncementMade,
    AnnouncementWithdrawn,
    BackendExited,
    BackendLoading,
    BackendReady,
    BackendsChanged,
    BackendStartFailed,
    BackendStopped,
    Event,
    MemoryMeasured,
    ProfileMeasured,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    Tick,
)
from yard.core.fairness import Shares
from yard.core.lifecycle import BackendState
from yard.core.planning import Planner
from yard.core.queue import Req, ReqState, leaves_last_slot
from yard.core.records import Backend, Device
from yard.core.spec import HOST, BackendSpec, DeviceSpec, Profile, SchedulerConfig
from yard.core.state import Core
from yard.core.timers import Timer
from yard.core.views import QueuedView, Snapshot

__all__ = ["Scheduler"]


_ROOM_EVENTS = (ProfileMeasured, AdminLoad, AdminUnload, AdminPin, AdminForgetProfile)
"""The events after which every plan is made afresh (``Core.room_version``)."""


class Scheduler:
    """The pure scheduling core. See the module docstring for its rules.

    devices: the memory pools (``host`` is added with unlimited size if absent).
    backends: every backend it may start; names must be unique.
    config: the policy's knobs.
    replan_everything: plan every backend waiting for a load afresh on every
        event instead of only what the event can change (slower; the reference
        the incremental planning is tested against).
    max_concurrent: per app, the most of its requests dispatched at once
        (``[apps.NAME] max_concurrent``); apps not in it have no such limit.
    weights: per app, its share of GPU time (``[apps.NAME] weight``; apps not
        in it have 1). Empty or None: the fairness term is off
        (:mod:`yard.core.fairness`).
    """

    def __init__(
        self,
        devices: Sequence[DeviceSpec],
        backends: Sequence[BackendSpec],
        config: SchedulerConfig | None = None,
        *,
        replan_everything: bool = False,
        max_concurrent: Mapping[str, int] | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        self.config = config if config is not None else SchedulerConfig()
        self._max_concurrent = dict(max_concurrent or {})
        devs: dict[str, Device] = {}
        for spec in devices:
            if spec.name in devs:
                raise ValueError(f"device {spec.name} is listed twice")
            devs[spec.name] = Device(spec)
        if HOST not in devs:
            devs[HOST] = Device(DeviceSpec(name=HOST, kind="host", total_bytes=2**62))
        bks: dict[str, Backend] = {}
        for bspec in backends:
            if bspec.name in bks:
                raise ValueError(f"backend {bspec.name} is listed twice")
            bks[bspec.name] = catalog.new_backend(bspec, self.config)
        self._core = Core(
            config=self.config,
            devices=dict(sorted(devs.items())),
            backends=dict(sorted(bks.items())),
        )
        if weights:
            if any(w <= 0 for w in weights.values()):
                raise ValueError("app weights must be positive")
            c = self.config
            self._core.shares = Shares(dict(weights), c.share_points, c.aging_rate)
        self._booted = False
        self._handled = 0  # events handled: views cached between two events stay valid
        self._order_cache: tuple[int, list[Req], dict[str, int], dict[str, int]] | None = None
        self._planner = Planner(self._core, replan_everything=replan_everything)

    # -- the one entry point ---------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Decision]:
        """Take one event at time ``now``; return the decisions, in order."""
        core = self._core
        out: list[Decision] = []
        self._handled += 1
        if not self._booted:
            self._booted = True
            core.room_version += 1
            for b in core.backends.values():
                if b.pinned:
                    b.want_load = True
        if core.timers.any_due(now):
            for due in core.timers.due(now, core.timer_live):
                request_events.timer(core, due, now, out)
        if isinstance(event, _ROOM_EVENTS):
            core.room_version += 1  # a profile, an operator's wish
        match event:
            case RequestArrived():
                request_events.arrived(core, event, now, out)
            case RequestCancelled():
                request_events.cancelled(core, event, now, out)
            case RequestFinished():
                request_events.finished(core, event, now, out)
            case BackendLoading():
                backend_events.loading(core, event)
            case BackendReady():
                backend_events.ready(core, event, now, out)
                windows.profile_changed(core, event.backend, now)
            case BackendStartFailed():
                backend_events.start_failed(core, event.backend, event.detail, event.oom, now, out)
            case BackendExited():
                backend_events.exited(core, event, now, out)
            case BackendStopped():
                backend_events.stopped(core, event)
            case ProfileMeasured():
                backend_events.profile(core, event, out)
                windows.profile_changed(core, event.backend, now)
            case MemoryMeasured():
                backend_events.memory(core, event, now, out)
            case AdminLoad():
                backend_events.admin_load(core, event, now, out)
            case AdminUnload():
                backend_events.admin_unload(core, event, out)
            case AdminPin():
                backend_events.admin_pin(core, event, now, out)
            case AdminForgetProfile():
                backend_events.forget(core, event)
            case BackendsChanged():
                catalog.changed(core, event, out)
            case Tick():
                pass
            case AnnouncementMade():
                windows.announce(core, event, now, out)
            case AnnouncementWithdrawn():
                windows.withdraw(core, event, now, out)
            case _:
                out.append(Flag(reason=f"ignored an event the core does not know: {event!r}"))
        self._pass(now, out)
        return out

    def next_wakeup(self) -> float | None:
        """When the engine must send a ``Tick`` (None: nothing is pending)."""
        core = self._core
        return core.timers.next(core.timer_live)

    def queue_length(self) -> int:
        """How many requests are waiting (O(1), unlike :meth:`snapshot`)."""
        core = self._core
        return core.queued

    def profile(self, backend: str) -> Profile | None:
        """The backend's current profile (margin not applied), if known."""
        core = self._core
        b = core.backends.get(backend)
        if b is None or b.profile is None:
            return None
        if b.profile_has_load:
            return b.profile
        return dataclasses.replace(b.profile, load_s=core.load_s(b))

    def wait_bound(
        self,
        *,
        max_service_s: float | None = None,
        announced_s: Iterable[float] | None = None,
        held: int | None = None,
    ) -> float | None:
        """The upper bound on a request's wait, in seconds (docs/wait-bound.md).

        Without work ahead it is ``W``. Each announcement whose window is open or
        near while the request waits adds its length, one load, one drain and
        the lead margin (``start_by - not_before + max_load_s + max_service_s +
        lead_margin_s``); each held request whose window is near while it waits
        adds ``max_load_s + lead_margin_s``. A held request's own wait counts
        from its ``not_before``.

        max_service_s: the longest a request may hold a slot; by default the
            longest one measured so far.
        announced_s: the lengths (``start_by - not_before``, seconds) of the
            announcements open or near while the request waits. None: those
            the core holds now, near or not (a far one may come near while it
            waits): the bound for a request that arrives now if no more are
            made. Given, they replace those held now: pass every window the
            request may see.
        held: how many held requests' windows are near while it waits (not
            its own). None: the requests held now.

        Returns None while a figure is unknown (a backend never loaded nor
        profiled, or no request ever served).
        """
        core = self._core
        c = core.config
        loads: list[float] = []
        services: list[float] = []
        for b in core.backends.values():
            if b.profile_has_load and b.profile is not None:
                loads.append(b.profile.load_s)
            elif b.learned_load_s is not None:
                loads.append(b.learned_load_s)
            else:
                return None
            if b.service_max is not None:
                services.append(b.service_max)
        if max_service_s is None:
            if not services:
                return None
            max_service_s = max(services)
        max_load_s = max(loads, default=0.0)
        spread = c.max_priority - c.min_priority + c.deadline_boost
        t = spread / c.aging_rate
        served_first = c.queue_limit + c.batch_bound + 1
        bound = t + served_first * (max_load_s + max_service_s)
        if core.shares is not None:
            # the weights' term, and one load of room given back (yard.core.lending)
            bound += c.share_points / c.aging_rate + max_load_s
        if announced_s is None:
            announced_s = self._announced_lengths()
        if held is None:
            held = core.windows.held_count()
        # An announcement's stand-in lives from its urgency (a load and a drain,
        # plus the margin, before it opens) until its window closes.
        per_announced = max_load_s + max_service_s + c.lead_margin_s
        bound += sum(w + per_announced for w in announced_s)
        # A held request's stand-in lives from a load and the margin before it opens.
        return bound + held * (max_load_s + c.lead_margin_s)

    def _announced_lengths(self) -> list[float]:
        """The lengths of the announcements the core holds now (not yet ended)."""
        return [win.closes - win.opens for win in self._core.windows.announced.values()]

    def _pass(self, now: float, out: list[Decision]) -> None:
        """What the state now allows: loads first (starts, evictions, drains),
        then dispatches to ready backends, then idle bookkeeping."""
        # Backends leaving the configuration move on first: one that just
        # stopped takes its new spec before anything plans to start it.
        catalog.settle_touched(self._core, out)
        if self._core.loans:
            lending.give_back(self._core, now)
        self._plan_loads(now, out)
        # Plan again after any overtake of a waiting swap, or a refused one:
        # the swap's sentence or its victims change, and a victim whose swap
        # used up its allowance must start draining now.
        if self._dispatch_all(now, out):
            self._plan_loads(now, out)
            self._dispatch_all(now, out)
        self._settle(now, out)

    def _plan_loads(self, now: float, out: list[Decision]) -> None:
        """A planning round, and another after each that started a load. The
        started backend leaves the order, and the plans after it, made while it
        claimed its devices, now read a load running there: the next round plans
        them again. Done here, in the event that started the load, that work is
        not left to whatever event comes next (mostly one that changes nothing
        else: a tick, a reading, a load's progress)."""
        planner = self._planner
        planner.round(now, out)
        while planner.started:
            planner.round(now, out)

    def _dispatch_all(self, now: float, out: list[Decision]) -> bool:
        """Dispatch what can go; True if an overtake of a waiting swap happened
        or was refused (either way the swap's victims must be planned again)."""
        core = self._core
        c = core.config
        any_sent = False
        # Requests dispatched per app, only while some app has a limit.
        serving = self._serving() if self._max_concurrent else None
        for name in sorted(core.ready):  # the order of core.backends (by name)
            b = core.backends[name]
            if not b.queue.size:
                continue
            while len(b.running) < b.slots:
                req = b.queue.head()
                if req is not None and serving is not None and self._held(req, serving):
                    req = next((r for r in b.queue.ordered() if not self._held(r, serving)), None)
                if req is None or leaves_last_slot(req, b.queue, b.running, b.slots, now):
                    break
                head = core.victim_of.get(b.name)
                first = b.dispatched_since_ready == 0
                before_due = ""
                if head is not None and head.state is ReqState.QUEUED and not first:
                    swap = core.backends[head.backend]
                    due = placement.load_due(swap, head, c)
                    if due is not None:
                        # An urgent window's load, not yet due: work expected
                        # to end by then goes (placement.ends_before), no overtake.
                        if not placement.ends_before(b, due, now, c):
                            break
                        before_due = reasons.ends_before_load(swap.name, due - now)
                        head = None
                    elif head.urgent or head.overtakes >= c.batch_bound:
                        break
                    elif estimates.overtake_denied(b, swap, now, c):
                        # No longer worth it: time passed since the plan let
                        # it batch. Planned again, the victim drains now.
                        core.touched.add(head.backend)
                        any_sent = True
                        break
                    else:
                        head.overtakes += 1
                        core.overtaken.add(head.backend)  # nothing else of it changed
                        core.unsettled.add(head.backend)
                else:
                    head = None
                core.unqueue(req)
                req.state = ReqState.RUNNING
                req.dispatched_at = now
                b.running[req.id] = req
                if serving is not None:
                    serving[req.app] = serving.get(req.app, 0) + 1
                if core.shares is not None:
                    core.shares.dispatched(req.share_tag)
                b.dispatched_since_ready += 1
                b.last_used = now
                core.note_use(b)
                b.idle_since = None
                eff = req.effective(now, c.aging_rate, c.deadline_boost)
                reason = reasons.dispatched(
                    b.name,
                    len(b.running),
                    b.slots,
                    req.id,
                    req.priority,
                    eff,
                    now - req.arrived_at,
                )
                if head is not None:
                    reason += reasons.overtakes_swap(
                        head.id, head.backend, head.overtakes, c.batch_bound
                    )
                elif first and b.name in core.victim_of:
                    reason += reasons.FIRST_BEFORE_SWAP
                reason += before_due
                out.append(Dispatch(request_id=req.id, backend=b.name, reason=reason))
                any_sent = any_sent or head is not None
        return any_sent

    def _serving(self) -> dict[str, int]:
        """Requests dispatched per app (running, or lost awaiting a verdict:
        both hold a slot)."""
        counts: dict[str, int] = {}
        for b in self._core.backends.values():
            for req in b.running.values():
                counts[req.app] = counts.get(req.app, 0) + 1
        return counts

    def _held(self, req: Req, serving: Mapping[str, int]) -> bool:
        """Whether ``req``'s app already has its ``max_concurrent`` dispatched."""
        limit = self._max_concurrent.get(req.app)
        return limit is not None and serving.get(req.app, 0) >= limit

    def _settle(self, now: float, out: list[Decision]) -> None:
        """Start the idle timer of a backend that became idle, stop one an
        operator unloads once its last request ended: only the backends
        touched since the last settling (nothing else changed)."""
        core = self._core
        names = core.unsettled | core.touched
        core.unsettled = set()
        for name in sorted(names):
            b = core.backends.get(name)
            if b is None:
                continue  # removed from the configuration (yard.core.catalog)
            if b.retiring is not None:
                catalog.settle(core, b, out)
                continue
            if b.state is BackendState.DRAINING and not b.running:
                if b.drain_reason == "admin":
                    core.stop(b, "unloaded by an operator", out)
                continue
            if b.state is BackendState.READY and not b.running and not b.queue.size:
                if b.idle_since is None:
                    b.idle_since = now
                    b.idle_token += 1
                    ttl = b.spec.idle_ttl_s
                    if ttl is not None and not b.pinned:
                        core.timers.set(now + ttl, Timer.IDLE, b.name, b.idle_token)
            else:
                b.idle_since = None

    def _positions(self) -> tuple[list[Req], dict[str, int], dict[str, int]]:
        """The dispatch order, each request's place in it and among the requests
        for its backend. Built once (O(n log n)) and reused until the next event,
        so that a page of jobs can each be explained cheaply."""
        core = self._core
        if self._order_cache is None or self._order_cache[0] != self._handled:
            ordered = views.dispatch_order(core.backends.values(), core.config.deadline_boost)
            overall, within = views.positions(ordered)
            self._order_cache = (self._handled, ordered, overall, within)
        _, ordered, overall, within = self._order_cache
        return ordered, overall, within

    def _view(
        self, req: Req, position: int, ahead: int, now: float, costs: dict[str, float]
    ) -> QueuedView:
        core = self._core
        b = core.backends[req.backend]
        swap_head = core.victim_of.get(b.name)
        view = views.queued_view(
            req, b, swap_head, core.config, position, ahead, now, core.start_cost_s, costs
        )
        limit = self._max_concurrent.get(req.app)
        if limit is not None:
            serving = self._serving().get(req.app, 0)
            if serving >= limit:
                reason = reasons.app_at_limit(req.app, serving, limit)
                return dataclasses.replace(view, reason=reason)
        return view

    def _held_view(self, req: Req, now: float) -> QueuedView:
        """A held request: it waits for its window to open, behind the queue."""
        return QueuedView(
            request_id=req.id,
            backend=req.backend,
            app=req.app,
            priority=req.priority,
            effective_priority=req.priority,
            arrived_at=req.arrived_at,
            start_by=req.start_by,
            position=self._core.queued,
            reason=windows.held_reason(self._core, req, now),
            estimated_start=windows.held_opens(self._core, req),
        )

    def explain(self, request_id: str, now: float) -> QueuedView | None:
        """Where a waiting request stands and why it waits (None: not waiting)."""
        core = self._core
        req = core.requests.get(request_id)
        if req is not None and req.state is ReqState.HELD:
            return self._held_view(req, now)
        if req is None or req.state is not ReqState.QUEUED:
            return None
        _, overall, within = self._positions()
        return self._view(req, overall[req.id], within[req.id], now, {})

    def snapshot(self, now: float, limit: int = 200) -> Snapshot:
        """Everything at once, for the dashboard and status (O(queue length));
        ``limit=0`` leaves the queue out and does not sort it (a cluster node's
        heartbeat, which needs devices and backends only)."""
        core = self._core
        queue: list[QueuedView] = []
        if limit > 0:
            ordered, _, within = self._positions()
            costs: dict[str, float] = {}
            queue = [
                self._view(req, i, within[req.id], now, costs)
                for i, req in enumerate(ordered[:limit])
            ]
        for rid in core.windows.held:  # after the queue: none of them may start yet
            if len(queue) >= limit:
                break
            queue.append(self._held_view(core.requests[rid], now))
        return Snapshot(
            now=now,
            devices=tuple(
                views.device_view(dev, core.occupants(d)) for d, dev in core.devices.items()
            ),
            backends=tuple(
                views.backend_view(b, self.profile(b.name)) for b in core.backends.values()
            ),
            queue=tuple(queue),
            queue_length=core.queued,
            windows=windows.window_views(core),
        )
