"""The scheduler: who goes first, what is loaded, what happens on failure.

``Scheduler.handle(event, now)`` is the only way its state changes; it returns
the decisions the engine must carry out, in order. It does no I/O and reads no
clock: the same events at the same times give the same decisions.

Rules it keeps
--------------

- Requests for one backend are dispatched in the order of
  :mod:`yard.core.queue` (priority with aging, urgent deadlines first), only
  to a ``ready`` backend with a free slot.
- A backend starts only where its reservation (profile x ``profile_margin``)
  fits on every device it gets (its GPUs and ``host``) next to the
  reservations (or live use, if higher) of every loaded, loading and stopping
  backend, the foreign use seen by the meter and the device's reserve. One
  load at a time per device: its GPUs, or ``host`` for a host-only backend
  (every backend holds some host memory, so counting ``host`` for all would
  serialise every load on the machine). A backend with no profile loads alone
  on those devices and is measured; nothing loads next to it until its
  profile arrives. Exclusive devices hold one backend at a time.
- Among several GPUs it may use, a backend goes where it needs no eviction,
  else where evicting costs least (no busy one if possible, then the least
  total reload time), then where the most memory is left, then by device name.
- Room is made by stopping idle, unpinned backends whose waiting requests do
  not rank above the request that needs the room, no more than needed. The
  least needed and cheapest to reload go first: those nobody waits for, then
  by GreedyDual-Size credit (Cao & Irani, 1997): on each use a backend gets
  ``L + load_s / GiB held``, where ``L`` is the credit of the last one
  evicted, so the cheapest to reload per byte goes first, yet a backend used
  since the last evictions outlives one idle for long. (Ranking by load time
  alone kept evicting the popular small model: twice the loads in the sim's
  memory-pressure sweep.) A busy one is never killed: it is *drained* (no new
  work) and stopped once idle. A backend loaded for waiting requests serves
  one of them before it can be evicted, so no load is wasted.
- Swap batching: while a request waits for such a swap, up to ``batch_bound``
  requests behind it may still be dispatched to the backends the swap will
  evict ("overtakes", counted per waiting request); then they drain. None
  while that request is urgent (its deadline is near), and none that could
  make the swap late: when a request waiting for the swap has a start-by, an
  overtake is allowed only if it ends, at the victim's high service estimate
  (the longest of its recent requests, not the mean), by the swap's latest
  start (the earliest such start-by minus the swap's load time).
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

Let ``rank(R) = priority(R) - aging_rate * arrived_at(R)`` (priorities are
clamped to ``[min_priority, max_priority]``) and ``B = deadline_boost``. The
queue order guarantees that whenever a request X is dispatched to backend b,
``rank(X) + B >= rank(R)`` for every R still waiting for b. Writing that out::

    arrived_at(X) <= arrived_at(R) + T,   T = (max_priority - min_priority + B) / aging_rate

so after ``arrived_at(R) + T`` no newly arrived request goes ahead of R on its
backend. The same rank comparison orders the loads (the best waiting request
of each backend that is not loaded is compared with the requests of the
backends a swap would evict: one whose requests rank higher is not evicted).
From then on only the requests already queued at ``arrived_at(R) + T`` (at
most ``queue_limit``), at most ``batch_bound`` overtakes per waiting head (the
deadline rule only refuses overtakes, so it never adds to them), and
the one request a backend serves right after loading before it may be evicted
are served before R, and each of them reaches its backend within one drain of
a busy backend and one load: at most ``max_service_s + max_load_s``. Hence::

    wait(R) <= W = T + (queue_limit + batch_bound + 1) * (max_load_s + max_service_s)

where ``max_load_s`` is the largest load time of any backend and
``max_service_s`` the longest time a request holds a slot. The bound assumes
what yard cannot control holds still: loads succeed, service times stay below
``max_service_s``, foreign memory does not grow, and every backend fits next to
the pinned ones. :meth:`Scheduler.wait_bound` computes ``W`` from the current
figures; the stateful tests check that no wait exceeds it.

A request whose start-by deadline passes while it waits is ended with
``deadline_missed`` (its wait ends there), unless it allows lateness.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from yard.core.decisions import (
    Decision,
    Dispatch,
    Flag,
    ProfileRaised,
    Reject,
    Requeue,
    StartBackend,
    StopBackend,
)
from yard.core.events import (
    AdminForgetProfile,
    AdminLoad,
    AdminPin,
    AdminUnload,
    BackendExited,
    BackendReady,
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
from yard.core.lifecycle import LOADED, OCCUPYING, BackendState, Move, can_move, move
from yard.core.queue import Req, ReqState, RequestQueue, order_key
from yard.core.spec import HOST, BackendSpec, DeviceSpec, Profile, SchedulerConfig
from yard.core.views import BackendView, DeviceView, QueuedView, Snapshot

__all__ = ["Scheduler"]

_GIB = 1024**3
_EWMA_ALPHA = 0.3
_RAISE_FACTOR = 1.10
_RECENT_LOAD_S = 5.0
"""An OOM this soon after another backend on the same device became ready
counts as caused by that load (its peak may outlast the health check)."""
_SERVICE_WINDOW = 64
"""How many recent service times the high estimate is the maximum of."""
_START_BY_SLACK_S = 0.05
"""A start-by this little before the arrival is handled still counts as met by
a start at once: ``X-Yard-Start-Within: 0`` is turned into an engine time
before the core sees the arrival, a moment later."""

# Plan outcomes, best first.
_START = 0  # start it now
_WAIT = 1  # memory is being freed or another load runs there; nothing to add
_EVICT = 2  # stop or drain other backends first
_BLOCKED = 3  # cannot make room now


def _gib(n: float) -> str:
    return f"{n / _GIB:.1f} GiB"


def _secs(s: float) -> str:
    return f"{s:.1f} s" if s < 100 else f"{s:.0f} s"


@dataclass(slots=True, eq=False)
class _Device:
    spec: DeviceSpec
    used: int | None = None
    foreign: int = 0

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(slots=True, eq=False)
class _Backend:
    spec: BackendSpec
    name: str  # spec.name, kept at hand: it is read on every planning round
    queue: RequestQueue
    pinned: bool
    state: BackendState = BackendState.STOPPED
    reason: str = "never started"
    wait_reason: str = ""
    running: dict[str, Req] = field(default_factory=dict)
    # placement of the current instance
    gpus: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    reserved: dict[str, int] = field(default_factory=dict)
    live: dict[str, int] = field(default_factory=dict)
    measuring: bool = False
    started_at: float | None = None
    ready_at: float | None = None
    overcommit: str | None = None
    # usage
    served: int = 0
    dispatched_since_ready: int = 0
    last_used: float = -math.inf
    credit: float = 0.0  # GreedyDual-Size: evicted lowest first
    idle_since: float | None = None
    idle_token: int = 0
    drain_reason: str | None = None
    want_load: bool = False
    unload_requested: bool = False
    self_caused_start_failures: int = 0
    # what the core learned
    profile: Profile | None = None
    profile_has_load: bool = False
    learned_load_s: float | None = None
    service_ewma: float | None = None
    service_max: float | None = None
    service_recent: deque[float] = field(default_factory=lambda: deque(maxlen=_SERVICE_WINDOW))

    @property
    def primary(self) -> tuple[str, ...]:
        return self.gpus if self.gpus else (HOST,)

    def busy(self) -> bool:
        return bool(self.running)

    def free_slots(self) -> int:
        return self.spec.slots - len(self.running)


@dataclass(slots=True, eq=False)
class _Plan:
    backend: _Backend
    gpus: tuple[str, ...]
    status: int
    reason: str
    need: dict[str, int] = field(default_factory=dict)
    stop: list[_Backend] = field(default_factory=list)
    drain: list[_Backend] = field(default_factory=list)
    pending: list[_Backend] = field(default_factory=list)
    cost: float = 0.0
    slack: int = 0
    free_wait_s: float = 0.0
    room: str = ""

    def key(self) -> tuple[int, bool, float, int, tuple[str, ...]]:
        busy = bool(self.drain or self.pending)
        return (self.status, busy, self.cost, -self.slack, self.gpus)

    @property
    def victims(self) -> list[_Backend]:
        return self.stop + self.drain + self.pending


@dataclass(slots=True, eq=False)
class _Ctx:
    """Who holds what on each device, for one planning round."""

    occupants: dict[str, list[_Backend]] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    freeing: dict[str, int] = field(default_factory=dict)
    loading: dict[str, _Backend] = field(default_factory=dict)
    held: dict[str, dict[str, int]] = field(default_factory=dict)
    heads: dict[str, Req | None] = field(default_factory=dict)
    evict_order: list[_Backend] = field(default_factory=list)


class Scheduler:
    """The pure scheduling core. See the module docstring for its rules.

    devices: the memory pools (``host`` is added with unlimited size if absent).
    backends: every backend it may start; names must be unique.
    config: the policy's knobs.
    """

    def __init__(
        self,
        devices: Sequence[DeviceSpec],
        backends: Sequence[BackendSpec],
        config: SchedulerConfig | None = None,
    ) -> None:
        self.config = config if config is not None else SchedulerConfig()
        devs: dict[str, _Device] = {}
        for spec in devices:
            if spec.name in devs:
                raise ValueError(f"device {spec.name} is listed twice")
            devs[spec.name] = _Device(spec)
        if HOST not in devs:
            devs[HOST] = _Device(DeviceSpec(name=HOST, kind="host", total_bytes=2**62))
        self._devices = dict(sorted(devs.items()))
        bks: dict[str, _Backend] = {}
        for bspec in backends:
            if bspec.name in bks:
                raise ValueError(f"backend {bspec.name} is listed twice")
            bks[bspec.name] = _Backend(
                spec=bspec,
                name=bspec.name,
                queue=RequestQueue(self.config.deadline_boost),
                pinned=bspec.pinned,
            )
        self._backends = dict(sorted(bks.items()))
        self._requests: dict[str, Req] = {}
        self._queued = 0
        self._wakeups: list[tuple[float, int, str, str, int]] = []
        self._seq = itertools.count()
        self._victim_of: dict[str, Req] = {}
        self._booted = False
        # Planning is skipped when nothing it reads changed: ``_epoch`` moves
        # with every such change, and the heads of the queues are compared.
        self._epoch = 0
        self._handled = 0  # events handled: views cached between two events stay valid
        self._order_cache: tuple[int, list[Req], dict[str, int], dict[str, int]] | None = None
        self._inflation = 0.0  # GreedyDual-Size "L": credit of the last evicted
        self._planned: tuple[object, ...] | None = None
        self._combo_cache: dict[str, list[tuple[str, ...]]] = {}
        self._fit_cache: dict[str, tuple[bool, str]] = {}
        self._need_cache: dict[tuple[str, tuple[str, ...]], dict[str, int]] = {}

    # -- the one entry point ---------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Decision]:
        """Take one event at time ``now``; return the decisions, in order."""
        out: list[Decision] = []
        self._handled += 1
        if not self._booted:
            self._booted = True
            for b in self._backends.values():
                if b.pinned:
                    b.want_load = True
        self._fire_wakeups(now, out)
        if not isinstance(
            event, RequestArrived | RequestFinished | RequestCancelled | MemoryMeasured | Tick
        ):
            self._epoch += 1
        match event:
            case RequestArrived():
                self._on_arrived(event, now, out)
            case RequestCancelled():
                self._on_cancelled(event, now)
            case RequestFinished():
                self._on_finished(event, now, out)
            case BackendReady():
                self._on_ready(event, now, out)
            case BackendStartFailed():
                self._on_start_failed(event.backend, event.detail, event.oom, now, out)
            case BackendExited():
                self._on_exited(event, now, out)
            case BackendStopped():
                self._on_stopped(event, now)
            case ProfileMeasured():
                self._on_profile(event, now, out)
            case MemoryMeasured():
                self._on_memory(event, out)
            case AdminLoad():
                self._on_admin_load(event, now, out)
            case AdminUnload():
                self._on_admin_unload(event, now, out)
            case AdminPin():
                self._on_admin_pin(event, out)
            case AdminForgetProfile():
                self._on_forget(event)
            case Tick():
                pass
            case _:
                out.append(Flag(reason=f"ignored an event the core does not know: {event!r}"))
        self._pass(now, out)
        return out

    def next_wakeup(self) -> float | None:
        """When the engine must send a ``Tick`` (None: nothing is pending)."""
        while self._wakeups and not self._wakeup_live(self._wakeups[0]):
            heapq.heappop(self._wakeups)
        return self._wakeups[0][0] if self._wakeups else None

    def queue_length(self) -> int:
        """How many requests are waiting (O(1), unlike :meth:`snapshot`)."""
        return self._queued

    def profile(self, backend: str) -> Profile | None:
        """The backend's current profile (margin not applied), if known."""
        b = self._backends.get(backend)
        if b is None or b.profile is None:
            return None
        if b.profile_has_load:
            return b.profile
        return Profile(
            gpu_bytes=b.profile.gpu_bytes, host_bytes=b.profile.host_bytes, load_s=self._load_s(b)
        )

    def wait_bound(self, *, max_service_s: float | None = None) -> float | None:
        """The documented upper bound ``W`` on any request's wait, in seconds.

        ``max_service_s``: the longest a request may hold a slot; by default the
        longest one measured so far. None while a figure is unknown (a backend
        never loaded nor profiled, or no request ever served).
        """
        c = self.config
        loads: list[float] = []
        services: list[float] = []
        for b in self._backends.values():
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
        t = (c.max_priority - c.min_priority + c.deadline_boost) / c.aging_rate
        served_first = c.queue_limit + c.batch_bound + 1
        return t + served_first * (max(loads, default=0.0) + max_service_s)

    # -- requests ----------------------------------------------------------------

    def _on_arrived(self, ev: RequestArrived, now: float, out: list[Decision]) -> None:
        c = self.config
        rid = ev.request_id
        if rid in self._requests:
            out.append(Flag(request_id=rid, reason=f"ignored a second arrival of {rid}"))
            return
        b = self._backends.get(ev.backend)
        if b is None:
            known = ", ".join(self._backends) or "none"
            out.append(
                Reject(
                    request_id=rid,
                    status=404,
                    code="model_not_found",
                    message=f"no backend named {ev.backend!r} (known: {known})",
                    reason=f"{rid}: unknown backend {ev.backend!r}",
                )
            )
            return
        fits, why = self._fits_empty_machine(b)
        if not fits:
            out.append(self._reject_new(rid, 503, "does_not_fit", why))
            return
        if self._queued >= c.queue_limit and not ev.requeued:
            retry = self._service_est(b)
            out.append(
                Reject(
                    request_id=rid,
                    status=503,
                    code="queue_full",
                    message=f"{self._queued} requests are waiting (queue_limit "
                    f"{c.queue_limit}); try again in about {_secs(retry)}",
                    retry_after_s=retry,
                    reason=f"{rid}: queue full ({self._queued} waiting)",
                )
            )
            return
        arrived = now if ev.arrived_at is None else min(ev.arrived_at, now)
        prio = min(max(ev.priority, c.min_priority), c.max_priority)
        req = Req(
            id=rid,
            backend=b.name,
            priority=prio,
            app=ev.app,
            arrived_at=arrived,
            rank=prio - c.aging_rate * arrived,
            start_by=ev.start_by,
            allow_late=ev.allow_late,
            requeued=ev.requeued,
        )
        if ev.start_by is not None:
            cost, how = self._start_cost(b, now)
            if now + cost > ev.start_by + _START_BY_SLACK_S:
                late = now + cost - ev.start_by
                msg = (
                    f"the earliest possible start is in {_secs(cost)} ({how}), "
                    f"{_secs(late)} after the requested start-by"
                )
                if not ev.allow_late:
                    out.append(self._reject_new(rid, 409, "deadline_infeasible", msg))
                    return
                req.late_flagged = True
                out.append(Flag(request_id=rid, backend=b.name, reason=f"accepted late: {msg}"))
            req.urgent_at = ev.start_by - self._worst_start_cost(b) - c.urgency_window_s
            if req.urgent_at <= now:
                req.urgent = True
            else:
                self._wake(req.urgent_at, "urgent", rid, req.gen)
            self._wake(ev.start_by, "deadline", rid, req.gen)
        self._requests[rid] = req
        if not b.queue.size:
            self._epoch += 1
        b.queue.push(req)
        self._queued += 1

    def _reject_new(self, rid: str, status: int, code: str, msg: str) -> Reject:
        return Reject(request_id=rid, status=status, code=code, message=msg, reason=f"{rid}: {msg}")

    def _on_cancelled(self, ev: RequestCancelled, now: float) -> None:
        req = self._requests.get(ev.request_id)
        if req is None:
            return
        if req.state is ReqState.QUEUED:
            self._unqueue(req)
        else:
            b = self._backends[req.backend]
            b.running.pop(req.id, None)
            b.last_used = now
            if not b.running:
                self._epoch += 1
        req.state = ReqState.DONE
        del self._requests[req.id]

    def _on_finished(self, ev: RequestFinished, now: float, out: list[Decision]) -> None:
        req = self._requests.get(ev.request_id)
        if req is None or req.state is not ReqState.RUNNING:
            return  # late or duplicate report
        b = self._backends[req.backend]
        if ev.outcome == "upstream_lost":
            # Keep the slot: the backend is probably dying; its exit report
            # decides whether yard caused it.
            req.state = ReqState.LOST
            req.lost_at = now
            self._wake(now + self.config.lost_grace_s, "lost", req.id, req.gen)
            return
        assert req.dispatched_at is not None
        sample = now - req.dispatched_at
        b.service_ewma = (
            sample
            if b.service_ewma is None
            else (1 - _EWMA_ALPHA) * b.service_ewma + _EWMA_ALPHA * sample
        )
        b.service_max = sample if b.service_max is None else max(b.service_max, sample)
        b.service_recent.append(sample)
        b.running.pop(req.id, None)
        b.served += 1
        b.last_used = now
        if not b.running:
            self._epoch += 1
        req.state = ReqState.DONE
        del self._requests[req.id]

    def _unqueue(self, req: Req) -> None:
        req.state = ReqState.DONE
        queue = self._backends[req.backend].queue
        queue.removed()
        self._queued -= 1
        if not queue.size:
            self._epoch += 1

    def _end(self, req: Req, status: int, code: str, message: str, out: list[Decision]) -> None:
        """End a queued, running or lost request with an error."""
        self._epoch += 1
        if req.state is ReqState.QUEUED:
            self._unqueue(req)
        else:
            self._backends[req.backend].running.pop(req.id, None)
        req.state = ReqState.DONE
        del self._requests[req.id]
        out.append(
            Reject(
                request_id=req.id,
                status=status,
                code=code,
                message=message,
                reason=f"{req.id}: {message}",
            )
        )

    def _requeue(self, req: Req, now: float, why: str, out: list[Decision]) -> None:
        b = self._backends[req.backend]
        b.running.pop(req.id, None)
        req.state = ReqState.QUEUED
        req.gen += 1
        req.requeued = True
        req.deadline_met = True  # it did start in time; yard lost the work
        req.overtakes = 0
        req.dispatched_at = None
        req.lost_at = None
        if req.urgent_at is not None and not req.urgent:
            self._wake(req.urgent_at, "urgent", req.id, req.gen)
        b.queue.push(req)
        self._queued += 1
        out.append(
            Requeue(
                request_id=req.id,
                reason=f"{req.id}: back in the queue at its old place (once): {why}",
            )
        )

    # -- backends ------------------------------------------------------------------

    def _set(self, b: _Backend, m: Move, reason: str) -> None:
        self._epoch += 1
        b.state = move(b.name, b.state, m)
        b.reason = reason

    def _on_ready(self, ev: BackendReady, now: float, out: list[Decision]) -> None:
        b = self._backends.get(ev.backend)
        if b is None or not can_move(b.state, Move.READY):
            return
        assert b.started_at is not None
        b.learned_load_s = now - b.started_at
        b.ready_at = now
        b.served = 0
        b.dispatched_since_ready = 0
        b.self_caused_start_failures = 0
        b.last_used = now
        self._set(b, Move.READY, f"ready after loading for {_secs(b.learned_load_s)}")
        if b.unload_requested:
            self._unload(b, now, out)

    def _on_start_failed(
        self, name: str, detail: str, oom: bool, now: float, out: list[Decision]
    ) -> None:
        b = self._backends.get(name)
        if b is None or b.state is not BackendState.STARTING:
            return
        caused = self._self_caused(b, now) if oom else None
        self._set(b, Move.START_FAILED, f"failed to start: {detail}")
        if caused is not None and b.self_caused_start_failures == 0:
            b.self_caused_start_failures += 1
            self._raise_profile(b, caused, out)
            self._release(b)
            self._reject_if_unfit(b, out)
            return
        self._release(b)  # its waiting requests stay; the next start uses the raised profile
        b.want_load = False
        # Clients must not hang on a command that does not start: the requests
        # waiting for it fail now, with the detail. New requests try it again.
        msg = f"backend {name} failed to start: {detail}"
        for req in b.queue.ordered():
            self._end(req, 502, "backend_failed", msg, out)

    def _on_exited(self, ev: BackendExited, now: float, out: list[Decision]) -> None:
        b = self._backends.get(ev.backend)
        if b is None:
            return
        detail = ev.detail or f"exit code {ev.exit_code}"
        if b.state is BackendState.STARTING:
            self._on_start_failed(b.name, detail, ev.oom, now, out)
            return
        if not can_move(b.state, Move.EXITED):
            return  # stopping: BackendStopped follows; stopped/failed: stale
        caused = self._self_caused(b, now) if ev.oom else None
        victims = list(b.running.values())
        self._set(b, Move.EXITED, f"exited on its own: {detail}")
        if caused is not None:
            self._raise_profile(b, caused, out)
        self._release(b)
        for req in victims:
            if caused is not None and not req.requeued:
                self._requeue(req, now, f"{b.name} ran out of memory because {caused}", out)
            else:
                msg = f"backend {b.name} failed: {detail}"
                if caused is not None:
                    msg += " (out of memory; this request was already requeued once)"
                self._end(req, 502, "backend_failed", msg, out)
        if caused is not None:
            self._reject_if_unfit(b, out)

    def _on_stopped(self, ev: BackendStopped, now: float) -> None:
        b = self._backends.get(ev.backend)
        if b is None or not can_move(b.state, Move.STOPPED):
            return
        self._set(b, Move.STOPPED, f"stopped ({b.reason})")
        self._release(b)

    def _release(self, b: _Backend) -> None:
        """The instance is gone: it holds no memory and no slots."""
        b.reserved = {}
        b.live = {}
        b.measuring = False
        b.drain_reason = None
        b.idle_since = None
        b.overcommit = None
        self._victim_of.pop(b.name, None)

    def _self_caused(self, b: _Backend, now: float) -> str | None:
        """Why yard over-committed one of ``b``'s devices, or None."""
        if b.overcommit is not None:
            return b.overcommit
        for d in b.devices:
            for o in self._occupants(d):
                if o is b:
                    continue
                if o.state is BackendState.STARTING:
                    return f"{o.name} was loading on {d} at the same time"
                recent = o.ready_at is not None and now - o.ready_at <= _RECENT_LOAD_S
                if recent and d in b.primary:
                    return f"{o.name} had just loaded on {d}"
        # No reading caught anyone above their profile, but yard placed other
        # backends on the same device: together they outgrew it, so a profile
        # proved too small. (Alone on its device, an OOM is the backend's own.)
        for d in b.primary:
            others = [o.name for o in self._occupants(d) if o is not b]
            if others:
                return (
                    f"it shared {d} with {', '.join(others)} and together they outgrew it "
                    "(a profile proved too small)"
                )
        return None

    def _raise_profile(self, b: _Backend, why: str, out: list[Decision]) -> None:
        old = b.profile
        if old is None:
            return
        live_gpu = max((b.live.get(g, 0) for g in b.gpus), default=0)
        live_host = b.live.get(HOST, 0)
        # Next to the same neighbours it would run out again, so on a shared
        # GPU the profile grows past what was left for it there: it is placed
        # elsewhere or alone until live readings tell better.
        crowded = 0
        for g in b.gpus:
            others = sum(self._occ(o, g) for o in self._occupants(g) if o is not b)
            if others:
                dev = self._devices[g]
                left = dev.spec.usable_bytes - dev.foreign - others
                crowded = max(crowded, math.floor(left / self.config.profile_margin) + 1)
        # The profile is a peak without margin: the last live reading is one.
        new = Profile(
            gpu_bytes=max(math.ceil(old.gpu_bytes * _RAISE_FACTOR), live_gpu, crowded)
            if b.gpus
            else old.gpu_bytes,
            host_bytes=max(math.ceil(old.host_bytes * _RAISE_FACTOR), live_host),
            load_s=old.load_s,
        )
        b.profile = new
        self._forget_fit(b)
        out.append(
            ProfileRaised(
                backend=b.name,
                profile=new,
                reason=f"{b.name} ran out of memory because {why}; profile raised from "
                f"{_gib(old.gpu_bytes)} GPU / {_gib(old.host_bytes)} host to "
                f"{_gib(new.gpu_bytes)} / {_gib(new.host_bytes)}",
            )
        )

    def _reject_if_unfit(self, b: _Backend, out: list[Decision]) -> None:
        """After a profile grew: its waiting requests fail if it can never fit."""
        fits, why = self._fits_empty_machine(b)
        if not fits:
            for req in b.queue.ordered():
                self._end(req, 503, "does_not_fit", why, out)

    # -- memory --------------------------------------------------------------------

    def _on_profile(self, ev: ProfileMeasured, now: float, out: list[Decision]) -> None:
        b = self._backends.get(ev.backend)
        if b is None:
            return
        load = ev.load_s
        if load is None and b.profile is not None and b.profile_has_load:
            load = b.profile.load_s
        b.profile_has_load = load is not None
        self._forget_fit(b)
        b.profile = Profile(
            gpu_bytes=ev.gpu_bytes,
            host_bytes=ev.host_bytes,
            load_s=load if load is not None else self._load_s(b),
        )
        if b.state in OCCUPYING and b.devices:
            b.reserved = dict(self._need(b, b.gpus))
            b.measuring = False
        self._reject_if_unfit(b, out)

    def _on_memory(self, ev: MemoryMeasured, out: list[Decision]) -> None:
        dev = self._devices.get(ev.device)
        if dev is None:
            return
        total = 0
        changed = False  # in what planning reads: memory held, foreign use
        for name, nbytes in ev.backends:
            total += nbytes
            b = self._backends.get(name)
            if b is None or b.state not in OCCUPYING or ev.device not in b.devices:
                continue  # a late reading of a stopped backend, or of a stranger
            before = self._occ(b, ev.device)
            b.live[ev.device] = nbytes
            changed = changed or self._occ(b, ev.device) != before
            if b.profile is not None and not b.measuring:
                limit = b.profile.gpu_bytes if ev.device != HOST else b.profile.host_bytes
                if nbytes > limit and b.overcommit is None:
                    b.overcommit = (
                        f"it used {_gib(nbytes)} on {ev.device}, above its profile {_gib(limit)}"
                    )
                    out.append(Flag(backend=b.name, reason=f"{b.name}: {b.overcommit}"))
        dev.used = ev.used_bytes
        foreign = max(0, ev.used_bytes - total)
        if foreign != dev.foreign or changed:
            self._epoch += 1
        dev.foreign = foreign
        usable = dev.spec.usable_bytes
        committed = sum(self._occ(o, ev.device) for o in self._occupants(ev.device))
        if ev.used_bytes > usable or committed + dev.foreign > usable:
            held = max(ev.used_bytes, committed + dev.foreign)
            why = f"{ev.device} was over-committed ({_gib(held)} in use or reserved, " + (
                f"{_gib(usable)} usable)"
            )
            flagged = [o.name for o in self._occupants(ev.device) if o.overcommit is None]
            for o in self._occupants(ev.device):
                if o.overcommit is None:
                    o.overcommit = why
            if flagged:
                out.append(Flag(reason=f"{why}; running there: {', '.join(flagged)}"))

    def _occupants(self, device: str) -> Iterable[_Backend]:
        for b in self._backends.values():
            if b.state in OCCUPYING and device in b.devices:
                yield b

    def _occ(self, b: _Backend, device: str) -> int:
        return max(b.reserved.get(device, 0), b.live.get(device, 0))

    def _need(self, b: _Backend, gpus: tuple[str, ...]) -> dict[str, int]:
        """Reservation on each device of a placement (0s while unmeasured).
        Cached until the profile changes: do not modify the result."""
        need = self._need_cache.get((b.name, gpus))
        if need is None:
            p = b.profile
            m = self.config.profile_margin
            need = {g: math.ceil(p.gpu_bytes * m) if p else 0 for g in gpus}
            need[HOST] = math.ceil(p.host_bytes * m) if p else 0
            self._need_cache[(b.name, gpus)] = need
        return need

    def _forget_fit(self, b: _Backend) -> None:
        """The profile changed: what was worked out from it is stale."""
        self._fit_cache.pop(b.name, None)
        for key in [k for k in self._need_cache if k[0] == b.name]:
            del self._need_cache[key]

    def _combos(self, b: _Backend) -> list[tuple[str, ...]]:
        combos = self._combo_cache.get(b.name)
        if combos is None:
            if not b.spec.gpus:
                combos = [()]
            else:
                gpus = sorted(g for g in b.spec.gpus if g in self._devices)
                combos = (
                    list(itertools.combinations(gpus, b.spec.gpu_count))
                    if len(gpus) >= b.spec.gpu_count
                    else []
                )
            self._combo_cache[b.name] = combos
        return combos

    def _fits_empty_machine(self, b: _Backend) -> tuple[bool, str]:
        known = self._fit_cache.get(b.name)
        if known is None:
            known = self._fit_cache[b.name] = self._fits_empty(b)
        return known

    def _fits_empty(self, b: _Backend) -> tuple[bool, str]:
        combos = self._combos(b)
        if not combos:
            present = ", ".join(g for g in self._devices if g != HOST) or "none"
            return False, (
                f"{b.name} needs {b.spec.gpu_count} of the GPUs {', '.join(b.spec.gpus)}; "
                f"this machine has: {present}"
            )
        if b.profile is None:
            return True, ""
        worst = ""
        for gpus in combos:
            need = self._need(b, gpus)
            short = [
                f"needs {_gib(n)} on {d}, usable {_gib(self._devices[d].spec.usable_bytes)}"
                for d, n in need.items()
                if n > self._devices[d].spec.usable_bytes
            ]
            if not short:
                return True, ""
            worst = worst or "; ".join(short)
        return False, f"{b.name} does not fit even on an empty machine: {worst}"

    # -- time ----------------------------------------------------------------------

    def _wake(self, at: float, kind: str, key: str, token: int) -> None:
        heapq.heappush(self._wakeups, (at, next(self._seq), kind, key, token))

    def _wakeup_live(self, w: tuple[float, int, str, str, int]) -> bool:
        _, _, kind, key, token = w
        if kind == "idle":
            b = self._backends[key]
            return b.idle_token == token and b.idle_since is not None
        req = self._requests.get(key)
        if req is None or req.gen != token:
            return False
        if kind == "urgent":
            return req.state is ReqState.QUEUED and not req.urgent
        if kind == "deadline":
            return req.state is ReqState.QUEUED and not req.deadline_met
        return req.state is ReqState.LOST

    def _fire_wakeups(self, now: float, out: list[Decision]) -> None:
        while self._wakeups and self._wakeups[0][0] <= now:
            w = heapq.heappop(self._wakeups)
            if not self._wakeup_live(w):
                continue
            _, _, kind, key, _ = w
            if kind == "idle":
                b = self._backends[key]
                if b.state is BackendState.READY and not b.running and not b.queue.size:
                    ttl = b.spec.idle_ttl_s
                    self._stop(
                        b,
                        f"idle for {_secs(now - (b.idle_since or now))} (idle_ttl_s {ttl:g})",
                        out,
                    )
                continue
            req = self._requests[key]
            b = self._backends[req.backend]
            if kind == "urgent":
                b.queue.make_urgent(req)
            elif kind == "deadline":
                assert req.start_by is not None
                if req.allow_late:
                    if not req.late_flagged:
                        req.late_flagged = True
                        out.append(
                            Flag(
                                request_id=req.id,
                                backend=b.name,
                                reason=f"{req.id}: start-by passed; it runs late as asked",
                            )
                        )
                else:
                    waited = now - req.arrived_at
                    self._end(
                        req,
                        504,
                        "deadline_missed",
                        f"its start-by deadline passed after {_secs(waited)} in the queue "
                        f"({self._waiting_reason(req, now, ahead=0)})",
                        out,
                    )
            else:  # lost
                self._end(
                    req,
                    502,
                    "backend_failed",
                    f"the connection to backend {b.name} broke and no exit was reported "
                    f"within {_secs(self.config.lost_grace_s)}",
                    out,
                )

    # -- estimates -----------------------------------------------------------------

    def _load_s(self, b: _Backend) -> float:
        if b.profile is not None and b.profile_has_load:
            return b.profile.load_s
        if b.learned_load_s is not None:
            return b.learned_load_s
        return self.config.default_load_s

    def _credit(self, b: _Backend) -> float:
        """GreedyDual-Size credit on use: reload seconds per GiB held, on top of
        the inflation. A backend used recently, slow to reload or small keeps
        its place; the least needed and cheapest to reload per byte goes first."""
        held = sum(b.reserved.values()) or sum(self._need(b, b.gpus).values())
        return self._inflation + self._load_s(b) / max(1.0, held / _GIB)

    def _service_est(self, b: _Backend) -> float:
        return b.service_ewma if b.service_ewma is not None else self.config.default_service_s

    def _service_hi(self, b: _Backend) -> float:
        """A high estimate of one request's service time (the longest of the
        recent ones): for promises about deadlines the mean is too hopeful."""
        if not b.service_recent:
            return self.config.default_service_s
        return max(max(b.service_recent), self._service_est(b))

    def _overtake_denied(self, victim: _Backend, swap: _Backend, now: float) -> str | None:
        """Why a request for ``victim`` may not go ahead of the swap to ``swap``
        by the swap's deadlines (None: it may). It may not if its service could
        end after the latest start of the swap: the earliest start-by of the
        requests waiting for ``swap`` minus its load time."""
        start_by = swap.queue.earliest_start_by()
        if start_by is None:
            return None
        latest = start_by - self._load_s(swap)
        ends = now + self._service_hi(victim)
        if ends <= latest:
            return None
        return (
            f"a request for {victim.name} could take {_secs(self._service_hi(victim))}, "
            f"past the latest start of the swap to {swap.name} "
            f"(start-by in {_secs(start_by - now)}, load {_secs(self._load_s(swap))})"
        )

    def _start_cost(self, b: _Backend, now: float) -> tuple[float, str]:
        """Expected time until a request for ``b`` could start if it went first."""
        if b.state is BackendState.READY:
            if b.free_slots() > 0:
                return 0.0, f"{b.name} is ready with a free slot"
            s = self._service_est(b)
            return s, f"{b.name} is busy; a slot frees in about {_secs(s)}"
        if b.state is BackendState.STARTING:
            assert b.started_at is not None
            rem = max(0.0, b.started_at + self._load_s(b) - now)
            return rem, f"{b.name} is loading, about {_secs(rem)} left"
        load = self._load_s(b)
        plan = self._best_plan(b, None, {}, set(), set(), now)
        free_wait = plan.free_wait_s if plan is not None else 0.0
        if b.state in LOADED:  # draining: wait for it to stop, then load again
            free_wait = max(free_wait, self._service_est(b))
        text = f"loading {b.name} takes about {_secs(load)}"
        if free_wait > 0:
            text += f" after about {_secs(free_wait)} to free memory"
        return load + free_wait, text

    def _worst_start_cost(self, b: _Backend) -> float:
        """Start cost if it must be loaded after busy neighbours drain: used for
        urgency, because a loaded backend may be evicted while a request waits."""
        devs = set(b.spec.gpus) | {HOST}
        drain = max(
            (
                self._service_hi(o)
                for o in self._backends.values()
                if o is not b and devs & (set(o.spec.gpus) | {HOST})
            ),
            default=0.0,
        )
        return self._load_s(b) + drain

    # -- the pass: plan loads, then dispatch --------------------------------------

    def _pass(self, now: float, out: list[Decision]) -> None:
        self._plan_all(now, out)
        # Plan again only when an overtake used up a swap's allowance: its
        # victim must start draining now.
        if self._dispatch_all(now, out):
            self._plan_all(now, out)
            self._dispatch_all(now, out)
        self._settle(now, out)

    def _dispatch_all(self, now: float, out: list[Decision]) -> bool:
        """Dispatch what can go; True if an overtake of a waiting swap happened
        or was refused (either way the swap's victims must be planned again)."""
        c = self.config
        any_sent = False
        for b in self._backends.values():
            if b.state is not BackendState.READY or not b.queue.size:
                continue
            while len(b.running) < b.spec.slots:
                req = b.queue.head()
                if req is None:
                    break
                head = self._victim_of.get(b.name)
                first = b.dispatched_since_ready == 0
                if head is not None and head.state is ReqState.QUEUED and not first:
                    if head.urgent or head.overtakes >= c.batch_bound:
                        break
                    if self._overtake_denied(b, self._backends[head.backend], now):
                        # No longer worth it: time passed since the plan let
                        # it batch. Planned again, the victim drains now.
                        self._epoch += 1
                        any_sent = True
                        break
                    head.overtakes += 1
                    self._epoch += 1
                else:
                    head = None
                if not b.running:
                    self._epoch += 1  # idle -> busy
                self._unqueue(req)
                req.state = ReqState.RUNNING
                req.dispatched_at = now
                b.running[req.id] = req
                b.dispatched_since_ready += 1
                b.last_used = now
                b.credit = self._credit(b)
                b.idle_since = None
                eff = req.effective(now, c.aging_rate, c.deadline_boost)
                reason = (
                    f"{b.name} has a free slot ({len(b.running)}/{b.spec.slots} busy); "
                    f"{req.id} priority {req.priority:g}, effective {eff:.1f}, "
                    f"waited {_secs(now - req.arrived_at)}"
                )
                if head is not None:
                    reason += (
                        f"; goes ahead of {head.id}'s swap to {head.backend} "
                        f"(overtake {head.overtakes} of {c.batch_bound})"
                    )
                elif first and b.name in self._victim_of:
                    reason += "; the first since it loaded, before it makes room for a swap"
                out.append(Dispatch(request_id=req.id, backend=b.name, reason=reason))
                any_sent = any_sent or head is not None
        return any_sent

    def _settle(self, now: float, out: list[Decision]) -> None:
        for b in self._backends.values():
            if b.state is BackendState.DRAINING and not b.running:
                if b.drain_reason == "admin":
                    self._stop(b, "unloaded by an operator", out)
                continue
            if b.state is BackendState.READY and not b.running and not b.queue.size:
                if b.idle_since is None:
                    b.idle_since = now
                    b.idle_token += 1
                    ttl = b.spec.idle_ttl_s
                    if ttl is not None and not b.pinned:
                        self._wake(now + ttl, "idle", b.name, b.idle_token)
            else:
                b.idle_since = None

    def _stop(self, b: _Backend, reason: str, out: list[Decision]) -> None:
        self._set(b, Move.STOP, reason)
        b.drain_reason = None
        b.idle_since = None
        out.append(StopBackend(backend=b.name, reason=f"stopping {b.name}: {reason}"))

    def _start(self, plan: _Plan, now: float, out: list[Decision]) -> None:
        b = plan.backend
        measure = b.profile is None
        head = b.queue.head()
        if head is not None:
            why = (
                f"{b.queue.size} request(s) waiting for {b.name} (next: {head.id}, "
                f"priority {head.priority:g})"
            )
        elif b.pinned:
            why = f"{b.name} is pinned"
        else:
            why = f"{b.name} was asked for"
        self._set(b, Move.START, f"loading: {why}")
        b.gpus = plan.gpus
        b.devices = (*plan.gpus, HOST)
        b.reserved = {} if measure else dict(plan.need)
        b.live = {}
        b.measuring = measure
        b.started_at = now
        b.ready_at = None
        b.want_load = False
        b.credit = self._credit(b)
        b.overcommit = None
        for d in b.devices:
            for o in self._occupants(d):
                if o is not b and o.state is BackendState.STARTING:
                    text = f"{o.name} and {b.name} were loading on {d} at the same time"
                    o.overcommit = o.overcommit or text
                    b.overcommit = b.overcommit or text
        placement = plan.reason if not measure else f"{plan.reason} (first load: measured alone)"
        out.append(
            StartBackend(
                backend=b.name,
                gpus=plan.gpus,
                measure=measure,
                reason=f"starting {b.name}: {why}; {placement}",
            )
        )

    def _context(self) -> _Ctx:
        """Who holds what, computed once per planning round."""
        ctx = _Ctx()
        for d in self._devices:
            ctx.occupants[d] = []
            ctx.used[d] = 0
            ctx.freeing[d] = 0
        occupying: list[_Backend] = []
        for b in self._backends.values():
            ctx.heads[b.name] = b.queue.head() if b.queue.size else None
            if b.state not in OCCUPYING:
                continue
            occupying.append(b)
            held: dict[str, int] = {}
            for d in b.devices:
                x = self._occ(b, d)
                held[d] = x
                ctx.occupants[d].append(b)
                ctx.used[d] += x
                if b.state is BackendState.STOPPING:
                    ctx.freeing[d] += x
                elif b.state is BackendState.STARTING:
                    ctx.loading.setdefault(d, b)
            ctx.held[b.name] = held
        occupying.sort(key=lambda o: (o.busy(), o.queue.size > 0, o.credit, o.last_used, o.name))
        ctx.evict_order = occupying
        return ctx

    def _plan_all(self, now: float, out: list[Decision]) -> None:
        cands = [
            b
            for b in self._backends.values()
            if b.state in (BackendState.STOPPED, BackendState.FAILED, BackendState.STOPPING)
            and (b.queue.size or b.want_load)
        ]
        victim_of: dict[str, Req] = {}
        taken: set[str] = set()
        if not cands:
            self._reprieve(taken, victim_of)
            self._planned = None
            return
        # What a plan reads besides the epoch: the heads of the backends waiting
        # for a load, and for every other backend with waiting requests how its
        # head ranks among those (whether it may be evicted for them). A
        # dispatch on a loaded backend that leaves all of that alone does not
        # re-plan. (Which idle victim goes first is revisited on the next
        # change of states, memory or heads.)
        boost = self.config.deadline_boost
        heads = [b.queue.head() for b in cands]
        keys = sorted(order_key(h, boost) for h in heads if h is not None)
        signature = (
            self._epoch,
            tuple(
                (b.name, h.id, h.urgent) if h else (b.name,)
                for b, h in zip(cands, heads, strict=True)
            ),
            tuple(
                (b.name, bisect.bisect_left(keys, order_key(h, boost)))
                for b in self._backends.values()
                if b.queue.size and b not in cands and (h := b.queue.head()) is not None
            ),
        )
        if signature == self._planned:
            return  # same inputs, same plan: it was carried out already
        ctx = self._context()

        def rank(b: _Backend) -> tuple[int, tuple[float, float, str]]:
            head = ctx.heads[b.name]
            if b.want_load or head is None:
                return (0, (0.0, 0.0, b.name))
            return (1, order_key(head, boost))

        cands.sort(key=rank)
        booked: dict[str, int] = {}
        claimed: set[str] = set()
        for b in cands:
            head = ctx.heads[b.name]
            if b.state is BackendState.STOPPING:
                b.wait_reason = f"waiting for {b.name} to finish stopping before it loads again"
                continue
            plan = self._best_plan(b, head, booked, claimed, taken, now, ctx)
            if plan is None:
                b.wait_reason = f"{b.name} has no place on this machine"
                continue
            b.wait_reason = plan.reason
            if plan.status == _START:
                self._start(plan, now, out)
                claimed.update(b.primary)
                ctx = self._context()
                continue
            if plan.status == _BLOCKED:
                continue
            for v in plan.stop:
                self._inflation = max(self._inflation, v.credit)
                self._stop(
                    v,
                    f"making room for {b.name} ({plan.room}); idle, cheapest to reload "
                    f"({_secs(self._load_s(v))})",
                    out,
                )
            for v in plan.drain:
                if v.state is BackendState.READY:
                    self._set(v, Move.DRAIN, f"draining to make room for {b.name} ({plan.room})")
                v.drain_reason = "swap"
            for v in plan.pending:
                if v.state is BackendState.DRAINING and v.drain_reason == "swap":
                    self._set(v, Move.UNDRAIN, f"serving a few more before the swap to {b.name}")
                    v.drain_reason = None
                if head is not None:
                    victim_of[v.name] = head
            if plan.stop:
                ctx = self._context()
            taken.update(v.name for v in plan.victims)
            for d, n in plan.need.items():
                booked[d] = booked.get(d, 0) + n
            claimed.update(plan.gpus or (HOST,))
        self._reprieve(taken, victim_of)
        self._planned = signature

    def _reprieve(self, taken: set[str], victim_of: dict[str, Req]) -> None:
        for b in self._backends.values():
            if (
                b.state is BackendState.DRAINING
                and b.drain_reason == "swap"
                and b.name not in taken
            ):
                self._set(b, Move.UNDRAIN, "ready again: the swap no longer needs its memory")
                b.drain_reason = None
        self._victim_of = victim_of

    def _best_plan(
        self,
        b: _Backend,
        head: Req | None,
        booked: dict[str, int],
        claimed: set[str],
        taken: set[str],
        now: float,
        ctx: _Ctx | None = None,
    ) -> _Plan | None:
        if ctx is None:
            ctx = self._context()
        best: _Plan | None = None
        for gpus in self._combos(b):
            plan = self._plan_on(b, head, gpus, booked, claimed, taken, now, ctx)
            if best is None or plan.key() < best.key():
                best = plan
        return best

    def _outranks(self, oh: Req | None, head: Req | None) -> bool:
        """Whether a backend whose best waiting request is ``oh`` stays for ``head``."""
        if oh is None:
            return False
        if head is None:
            return True
        boost = self.config.deadline_boost
        return order_key(oh, boost) < order_key(head, boost)

    def _plan_on(
        self,
        b: _Backend,
        head: Req | None,
        gpus: tuple[str, ...],
        booked: dict[str, int],
        claimed: set[str],
        taken: set[str],
        now: float,
        ctx: _Ctx,
    ) -> _Plan:
        c = self.config
        primary = gpus or (HOST,)
        devs = (*gpus, HOST)
        measure = b.profile is None
        need = self._need(b, gpus)
        for d in primary:
            if d in claimed:
                return _Plan(
                    b,
                    gpus,
                    _BLOCKED,
                    f"waiting for {d}: it is being prepared for a request that ranks higher",
                    need=need,
                )
            loader = ctx.loading.get(d)
            if loader is not None and loader is not b:
                return _Plan(
                    b,
                    gpus,
                    _WAIT,
                    f"waiting for {d}: {loader.name} is loading there (one load at a time)",
                    need=need,
                )
        where = "+".join(primary)
        # Who must go: on exclusive devices everybody; for a first (measured)
        # load everybody on its devices; next to a backend whose footprint is
        # unknown, that backend.
        required: list[_Backend] = []
        for d in primary:
            alone = measure or self._devices[d].spec.exclusive
            for o in ctx.occupants[d]:
                if o is not b and (alone or o.measuring) and o not in required:
                    required.append(o)
        free_now: dict[str, int] = {}
        eventual: dict[str, int] = {}
        deficit: dict[str, int] = {}
        for d in devs:
            dev = self._devices[d]
            free_now[d] = dev.spec.usable_bytes - dev.foreign - ctx.used[d] - booked.get(d, 0)
            eventual[d] = free_now[d] + ctx.freeing[d]
            deficit[d] = need[d] - eventual[d]

        def eligible(o: _Backend) -> str | None:
            if o.pinned:
                return f"{o.name} is pinned"
            if o.state not in LOADED:
                return f"{o.name} is {o.state.value}"
            if o.name in taken:
                return f"{o.name} is already making room for another swap"
            if self._outranks(ctx.heads[o.name], head):
                return f"requests for {o.name} rank higher"
            return None

        def free(o: _Backend, sign: int) -> None:
            held = ctx.held[o.name]
            for d in devs:
                x = held.get(d)
                if x:
                    deficit[d] -= sign * x

        chosen: list[_Backend] = []
        still_stopping = False
        for o in required:
            if o.state is BackendState.STOPPING:
                still_stopping = True
                continue
            why_not = eligible(o)
            if why_not is not None:
                return _Plan(
                    b,
                    gpus,
                    _BLOCKED,
                    f"waiting for {where}: {b.name} must load alone there and {why_not}",
                    need=need,
                )
            chosen.append(o)
            free(o, 1)
        if any(x > 0 for x in deficit.values()):
            blockers: list[str] = []
            greedy: list[_Backend] = []
            for o in ctx.evict_order:
                if o is b or o in chosen:
                    continue
                held = ctx.held[o.name]
                if not any(deficit[d] > 0 and held.get(d, 0) > 0 for d in devs):
                    continue
                why_not = eligible(o)
                if why_not is not None:
                    if o.state is not BackendState.STOPPING:
                        blockers.append(why_not)
                    continue
                greedy.append(o)
                free(o, 1)
                if all(x <= 0 for x in deficit.values()):
                    break
            if any(x > 0 for x in deficit.values()):
                short = max(devs, key=lambda d: deficit[d])
                text = (
                    f"waiting for {short}: {b.name} needs {_gib(need[short])}, "
                    f"{_gib(max(0, eventual[short]))} free"
                )
                if blockers:
                    text += "; cannot make room: " + ", ".join(blockers)
                return _Plan(b, gpus, _BLOCKED, text, need=need)
            # stop no more than needed: drop greedy picks that turned out spare
            for o in reversed(list(greedy)):
                held = ctx.held[o.name]
                if all(deficit[d] + held.get(d, 0) <= 0 for d in devs):
                    greedy.remove(o)
                    free(o, -1)
            chosen.extend(greedy)
        slack = min(-deficit[d] for d in devs)
        if not chosen:
            if not still_stopping and all(need[d] <= free_now[d] for d in devs):
                fig = ", ".join(
                    f"{d}: needs {_gib(need[d])}, {_gib(free_now[d])} free"
                    if b.profile is not None
                    else f"{d}: {_gib(free_now[d])} free, no profile yet"
                    for d in devs
                )
                return _Plan(b, gpus, _START, f"placed on {where} ({fig})", need=need, slack=slack)
            stopping = [
                o.name
                for o in ctx.evict_order
                if o.state is BackendState.STOPPING and any(d in o.devices for d in devs)
            ]
            return _Plan(
                b,
                gpus,
                _WAIT,
                f"waiting for {', '.join(stopping) or 'memory'} to stop and free memory on {where}",
                need=need,
                slack=slack,
            )
        plan = _Plan(b, gpus, _EVICT, "", need=need, slack=slack)
        parts: list[str] = []
        for o in chosen:
            plan.cost += self._load_s(o)
            # A backend loaded for waiting requests serves one of them before
            # it goes (else its load was wasted). Batching beyond that is worth
            # it only while the swap's head can wait: an urgent deadline gets
            # the swap at once.
            fresh = o.state is BackendState.READY and o.dispatched_since_ready == 0
            batching = (
                head is not None
                and not head.urgent
                and head.overtakes < c.batch_bound
                and self._overtake_denied(o, b, now) is None
            )
            if o.queue.size > 0 and (fresh or batching):
                plan.pending.append(o)
                if batching and head is not None:
                    more = c.batch_bound - head.overtakes
                    parts.append(f"{o.name} serves up to {more} more first")
                else:
                    parts.append(f"{o.name} serves its first request since loading first")
                plan.free_wait_s = max(plan.free_wait_s, self._service_est(o))
            elif o.busy():
                plan.drain.append(o)
                parts.append(f"busy {o.name} must finish before the swap")
                plan.free_wait_s = max(plan.free_wait_s, self._service_est(o))
            else:
                plan.stop.append(o)
                parts.append(
                    f"stopping idle {o.name} (cheapest to reload, {_secs(self._load_s(o))})"
                )
        short = max(devs, key=lambda d: (need[d] - free_now[d], d))
        if b.profile is None:
            plan.room = f"{short}: {b.name} has no profile yet and loads alone to be measured"
        else:
            plan.room = (
                f"{short}: {b.name} needs {_gib(need[short])}, {_gib(max(0, free_now[short]))} free"
            )
        plan.reason = f"waiting for {plan.room}; " + "; ".join(parts)
        return plan

    # -- admin ---------------------------------------------------------------------

    def _on_admin_load(self, ev: AdminLoad, now: float, out: list[Decision]) -> None:
        b = self._backends.get(ev.backend)
        if b is None:
            out.append(Flag(reason=f"admin load: no backend named {ev.backend!r}"))
            return
        if b.state not in (BackendState.STOPPED, BackendState.FAILED):
            out.append(Flag(backend=b.name, reason=f"admin load: {b.name} is {b.state.value}"))
            return
        plan = self._best_plan(b, None, {}, set(), set(), now)
        if plan is None or plan.status != _START:
            why = plan.reason if plan is not None else f"{b.name} has no place on this machine"
            out.append(Flag(backend=b.name, reason=f"admin load: not loading {b.name} now: {why}"))
            return
        self._start(plan, now, out)

    def _on_admin_unload(self, ev: AdminUnload, now: float, out: list[Decision]) -> None:
        b = self._backends.get(ev.backend)
        if b is None:
            out.append(Flag(reason=f"admin unload: no backend named {ev.backend!r}"))
            return
        if b.pinned:
            out.append(Flag(backend=b.name, reason=f"admin unload: {b.name} is pinned; unpin it"))
            return
        b.want_load = False
        if b.state is BackendState.STARTING:
            b.unload_requested = True
            return
        if b.state not in LOADED:
            out.append(Flag(backend=b.name, reason=f"admin unload: {b.name} is {b.state.value}"))
            return
        self._unload(b, now, out)

    def _unload(self, b: _Backend, now: float, out: list[Decision]) -> None:
        b.unload_requested = False
        if not b.running:
            self._stop(b, "unloaded by an operator", out)
            return
        if b.state is BackendState.READY:
            self._set(b, Move.DRAIN, "unloading once its requests finish (operator)")
        b.drain_reason = "admin"

    def _on_forget(self, ev: AdminForgetProfile) -> None:
        b = self._backends.get(ev.backend)
        if b is not None:
            b.profile = None
            b.profile_has_load = False
            self._forget_fit(b)

    def _on_admin_pin(self, ev: AdminPin, out: list[Decision]) -> None:
        b = self._backends.get(ev.backend)
        if b is None:
            out.append(Flag(reason=f"admin pin: no backend named {ev.backend!r}"))
            return
        b.pinned = ev.pinned
        b.want_load = ev.pinned and b.state not in OCCUPYING
        if ev.pinned and b.state is BackendState.DRAINING and b.drain_reason == "admin":
            self._set(b, Move.UNDRAIN, "pinned again")
            b.drain_reason = None

    # -- views ---------------------------------------------------------------------

    def _waiting_reason(self, req: Req, now: float, ahead: int) -> str:
        b = self._backends[req.backend]
        before = (
            f"behind {ahead} request(s) of higher effective priority for {b.name}; "
            if ahead
            else ""
        )
        if b.state is BackendState.READY:
            head = self._victim_of.get(b.name)
            if head is not None and head.overtakes >= self.config.batch_bound:
                return before + (
                    f"held back: {b.name} will be swapped out for {head.backend} "
                    f"({head.id} waits; {self.config.batch_bound} overtakes used)"
                )
            if b.free_slots() <= 0:
                return before + (
                    f"waiting for a free slot on {b.name} ({len(b.running)}/{b.spec.slots} "
                    f"busy, est. {_secs(self._service_est(b))})"
                )
            return before + f"about to be dispatched to {b.name}"
        if b.state is BackendState.STARTING:
            cost, _ = self._start_cost(b, now)
            return before + f"waiting for {b.name} to load (est. {_secs(cost)})"
        if b.state is BackendState.DRAINING:
            return before + f"waiting: {b.name} is draining ({b.reason})"
        if b.state is BackendState.STOPPING:
            return before + f"waiting: {b.name} is stopping ({b.reason}); it loads again after"
        return before + (b.wait_reason or f"waiting for {b.name} to be loaded")

    def _positions(self) -> tuple[list[Req], dict[str, int], dict[str, int]]:
        """The dispatch order, each request's place in it and among the requests
        for its backend. Built once (O(n log n)) and reused until the next event,
        so that a page of jobs can each be explained cheaply."""
        if self._order_cache is None or self._order_cache[0] != self._handled:
            ordered = self._ordered_all()
            overall: dict[str, int] = {}
            within: dict[str, int] = {}
            counts: dict[str, int] = {}
            for i, r in enumerate(ordered):
                overall[r.id] = i
                n = counts.get(r.backend, 0)
                within[r.id] = n
                counts[r.backend] = n + 1
            self._order_cache = (self._handled, ordered, overall, within)
        _, ordered, overall, within = self._order_cache
        return ordered, overall, within

    def _ordered_all(self) -> list[Req]:
        boost = self.config.deadline_boost
        lists = [b.queue.ordered() for b in self._backends.values() if b.queue.size]
        idx = [0] * len(lists)
        out: list[Req] = []
        while True:
            best = -1
            for i, lst in enumerate(lists):
                if idx[i] < len(lst) and (
                    best < 0
                    or order_key(lst[idx[i]], boost) < order_key(lists[best][idx[best]], boost)
                ):
                    best = i
            if best < 0:
                return out
            out.append(lists[best][idx[best]])
            idx[best] += 1

    def _view(
        self,
        req: Req,
        position: int,
        ahead: int,
        now: float,
        costs: dict[str, float] | None = None,
    ) -> QueuedView:
        c = self.config
        b = self._backends[req.backend]
        if costs is None:
            costs = {}
        if b.name not in costs:
            costs[b.name] = self._start_cost(b, now)[0]
        cost = costs[b.name]
        est = now + cost + ahead * self._service_est(b) / b.spec.slots
        return QueuedView(
            request_id=req.id,
            backend=req.backend,
            app=req.app,
            priority=req.priority,
            effective_priority=req.effective(now, c.aging_rate, c.deadline_boost),
            arrived_at=req.arrived_at,
            start_by=req.start_by,
            position=position,
            reason=self._waiting_reason(req, now, ahead),
            estimated_start=est,
        )

    def explain(self, request_id: str, now: float) -> QueuedView | None:
        """Where a waiting request stands and why it waits (None: not waiting)."""
        req = self._requests.get(request_id)
        if req is None or req.state is not ReqState.QUEUED:
            return None
        _, overall, within = self._positions()
        return self._view(req, overall[req.id], within[req.id], now)

    def snapshot(self, now: float, limit: int = 200) -> Snapshot:
        """Everything at once, for the dashboard and status (O(queue length))."""
        ordered, _, within = self._positions()
        costs: dict[str, float] = {}
        queue = [
            self._view(req, i, within[req.id], now, costs) for i, req in enumerate(ordered[:limit])
        ]
        devices = []
        for d, dev in self._devices.items():
            occ = list(self._occupants(d))
            committed = sum(o.reserved.get(d, 0) for o in occ)
            held = sum(self._occ(o, d) for o in occ)
            devices.append(
                DeviceView(
                    name=d,
                    kind=dev.spec.kind,
                    total_bytes=dev.spec.total_bytes,
                    reserve_bytes=dev.spec.reserve_bytes,
                    committed_bytes=committed,
                    live_bytes={o.name: o.live[d] for o in occ if d in o.live},
                    foreign_bytes=dev.foreign,
                    free_bytes=max(0, dev.spec.usable_bytes - held - dev.foreign),
                    exclusive=dev.spec.exclusive,
                )
            )
        backends = tuple(
            BackendView(
                name=b.name,
                state=b.state.value,
                gpus=b.gpus if b.state in OCCUPYING else (),
                inflight=len(b.running),
                slots=b.spec.slots,
                served=b.served,
                loaded_at=b.ready_at if b.state in LOADED else None,
                pinned=b.pinned,
                profile=self.profile(b.name),
                last_load_s=b.learned_load_s,
                reason=f"{b.reason}; {b.queue.size} waiting: {b.wait_reason}"
                if b.wait_reason and b.queue.size and b.state not in OCCUPYING
                else b.reason,
                queued=b.queue.size,
            )
            for b in self._backends.values()
        )
        return Snapshot(
            now=now,
            devices=tuple(devices),
            backends=backends,
            queue=tuple(queue),
            queue_length=self._queued,
        )
