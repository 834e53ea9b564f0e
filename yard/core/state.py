"""The scheduler's state, and the bookkeeping every part of it shares.

:class:`Core` holds everything the scheduler knows: the devices, the backends,
the requests, the timers and the caches worked out from profiles. Its methods
are the small moves the event handlers (:mod:`~yard.core.request_events`,
:mod:`~yard.core.backend_events`) and the pass (:mod:`~yard.core.scheduler`)
share: a backend's state transition, a stop, a start, the end or requeue of a
request, and the questions placement and estimates answer about the current
state. It does no I/O; the clock comes in as ``now``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from yard.core import estimates, placement, reasons, resources, views
from yard.core.decisions import Decision, Reject, Requeue, StartBackend, StopBackend
from yard.core.fairness import Shares
from yard.core.lifecycle import OCCUPYING, BackendState, Move, move
from yard.core.placement import loading
from yard.core.plans import Outcome, Plan, Reads, Room
from yard.core.queue import Req, ReqState
from yard.core.records import Backend, Device, Loan
from yard.core.spec import HOST, SchedulerConfig
from yard.core.timers import Timer, Timers
from yard.core.window_state import Windows

Options = list[tuple[tuple[str, ...], Mapping[str, int]]]
"""Every GPU set a backend may take, with its need per device there."""


@dataclass(slots=True, eq=False)
class Core:
    """Everything the scheduler knows, and the moves its parts share.

    backends: by name; every visit of them keeps that order (dispatch, surveys).
    victim_of: per backend a swap will evict, the waiting request the swap is for.
    inflation: GreedyDual-Size "L", the credit of the last backend evicted.
    room_version: moves whenever the machine changes in a way every plan may
        read: a profile, who is pinned or wanted loaded. Planning starts afresh
        when it moved.
    transitions: counts the lifecycle moves (a round that makes one plans the
        backends after it afresh).
    touched: the backends whose state, queue or usage (slots, service times,
        credit) changed since the last planning round; the round revisits only the plans
        that read them (see :mod:`yard.core.planning`).
    touched_devices: what changed on the devices since the last planning round:
        a device's name for its memory figures (held, freed, foreign, who holds
        it), :func:`~yard.core.placement.loading` of it for whether a load runs
        there.
    overtaken: the swaps whose head a request for a victim went ahead of since
        the last planning round (its overtakes, all that changed of them: the
        round tells their plans' sentences again, :mod:`yard.core.reworks`).
    unsettled: the backends touched since the scheduler last settled them
        (idle timers, operator unloads), besides those in ``touched``.
    draining: the backends in the draining state.
    ready: the backends in the ready state (dispatch visits only these).
    occupying: the backends that hold or take memory (starting, ready, draining,
        stopping): surveys and occupants visit only these.
    windows: held requests and announcements (:mod:`yard.core.windows`).
    drains: the longest high service estimate of any backend and the second
        longest, with their backends, at a ``room_version`` (the backends
        change only with it); kept as finishes note service times
        (:meth:`service_noted`) for :meth:`worst_drain`. None: worked out
        again when asked.
    """

    config: SchedulerConfig
    devices: dict[str, Device]
    backends: dict[str, Backend]
    requests: dict[str, Req] = field(default_factory=dict)
    queued: int = 0
    timers: Timers = field(default_factory=Timers)
    victim_of: dict[str, Req] = field(default_factory=dict)
    inflation: float = 0.0
    room_version: int = 0
    transitions: int = 0
    touched: set[str] = field(default_factory=set)
    touched_devices: set[str] = field(default_factory=set)
    overtaken: set[str] = field(default_factory=set)
    unsettled: set[str] = field(default_factory=set)
    draining: set[str] = field(default_factory=set)
    ready: set[str] = field(default_factory=set)
    occupying: set[str] = field(default_factory=set)
    options_cache: dict[str, Options] = field(default_factory=dict)
    fit_cache: dict[str, tuple[bool, str]] = field(default_factory=dict)
    shares: Shares | None = None  # the apps' fairness term; None: no app has a weight
    windows: Windows = field(default_factory=Windows)
    retiring: set[str] = field(default_factory=set)  # leaving the configuration (catalog)
    drains: tuple[int, Backend | None, float, Backend | None, float] | None = None
    # stopped backends whose room an app ahead of its share borrowed, by name
    # (yard.core.lending)
    loans: dict[str, Loan] = field(default_factory=dict)

    def unqueue(self, req: Req) -> None:
        req.state = ReqState.DONE
        queue = self.backends[req.backend].queue
        queue.removed(req)
        self.queued -= 1
        self.touched.add(req.backend)

    def end(self, req: Req, status: int, code: str, message: str, out: list[Decision]) -> None:
        """End a queued, running or lost request with an error."""
        self.touched.add(req.backend)
        if req.state is ReqState.QUEUED:
            self.unqueue(req)
        else:
            self.backends[req.backend].running.pop(req.id, None)
        req.state = ReqState.DONE
        del self.requests[req.id]
        out.append(
            Reject(
                request_id=req.id,
                status=status,
                code=code,
                message=message,
                reason=f"{req.id}: {message}",
            )
        )

    def requeue(self, req: Req, why: str, out: list[Decision]) -> None:
        b = self.backends[req.backend]
        b.running.pop(req.id, None)
        req.state = ReqState.QUEUED
        req.gen += 1
        req.requeued = True
        req.deadline_met = True  # it did start in time; yard lost the work
        req.overtakes = 0
        req.dispatched_at = None
        req.lost_at = None
        if req.urgent_at is not None and not req.urgent:
            self.timers.set(req.urgent_at, Timer.URGENT, req.id, req.gen)
        b.queue.push(req)
        self.queued += 1
        self.touched.add(b.name)
        reason = f"{req.id}: back in the queue at its old place (once): {why}"
        out.append(Requeue(request_id=req.id, reason=reason))

    def transition(self, b: Backend, m: Move, reason: str) -> None:
        """Move ``b`` through its lifecycle table (an illegal move raises)."""
        self.transitions += 1
        self.touched.add(b.name)
        # What plans weigh on its devices: the memory held or being freed there
        # (and who occupies it), and whether a load runs there.
        if m in (Move.STOP, Move.STOPPED, Move.EXITED, Move.START_FAILED):
            self.touched_devices.update(b.devices)
        if m in (Move.READY, Move.STOPPED, Move.EXITED, Move.START_FAILED):
            self.touched_devices.update(loading(d) for d in b.devices)
        b.state = move(b.name, b.state, m)
        b.reason = reason
        if b.state is BackendState.DRAINING:
            self.draining.add(b.name)
        else:
            self.draining.discard(b.name)
        if b.state is BackendState.READY:
            self.ready.add(b.name)
        else:
            self.ready.discard(b.name)
        if b.state in OCCUPYING:
            self.occupying.add(b.name)
        else:
            self.occupying.discard(b.name)

    def release(self, b: Backend) -> None:
        """The instance is gone: it holds no memory and no slots."""
        b.reserved = {}
        b.live = {}
        b.measuring = False
        b.loading = ""
        b.drain_reason = None
        b.idle_since = None
        b.overcommit = None
        self.victim_of.pop(b.name, None)

    def occupants(self, device: str) -> Iterable[Backend]:
        for b in self._occupying():
            if device in b.devices:
                yield b

    def _occupying(self) -> list[Backend]:
        """The occupying backends in the order of ``backends`` (by name)."""
        return [self.backends[name] for name in sorted(self.occupying)]

    def need(self, b: Backend, gpus: tuple[str, ...]) -> Mapping[str, int]:
        """Reservation on each device of a placement (0s while unmeasured)."""
        for option, need in self.options(b):
            if option == gpus:
                return need
        return _need(b, gpus, self.config.profile_margin)

    def need_running(self, b: Backend) -> dict[str, int]:
        """The reservation of ``b``'s instance, placed on ``b.gpus``, at the
        context and slot count its start got (not the required ones: those
        only place it)."""
        m = self.config.profile_margin
        return resources.need_at(b.estimate, b.gpus, m, b.context, b.parallel)

    def options(self, b: Backend) -> Options:
        """Every GPU set ``b`` may take with its need there; cached until its
        profile changes."""
        options = self.options_cache.get(b.name)
        if options is None:
            m = self.config.profile_margin
            options = [(g, _need(b, g, m)) for g in placement.gpu_sets(b, self.devices)]
            self.options_cache[b.name] = options
            b.places = len(options)
        return options

    def forget_fit(self, b: Backend) -> None:
        """The profile changed: what was worked out from it is stale."""
        self.fit_cache.pop(b.name, None)
        self.options_cache.pop(b.name, None)

    def fits_empty_machine(self, b: Backend) -> tuple[bool, str]:
        known = self.fit_cache.get(b.name)
        if known is None:
            margin = self.config.profile_margin
            known = placement.fits_empty(b, self.options(b), self.devices, margin)
            self.fit_cache[b.name] = known
        return known

    def load_s(self, b: Backend) -> float:
        return estimates.load_s(b, self.config)

    def service_est(self, b: Backend) -> float:
        return estimates.service_est(b, self.config)

    def note_use(self, b: Backend) -> None:
        """``b`` starts or serves: its GreedyDual-Size credit and its reload
        cost per GiB (:func:`yard.core.victims.demand`) as of now."""
        # (its placement's need counts only where it holds no reservation)
        need = b.reserved if sum(b.reserved.values()) else self.need(b, b.gpus)
        per_gib = estimates.reload_per_gib(b, need, self.config)
        b.credit = self.inflation + per_gib
        b.reload_log = math.log(max(per_gib, 1e-9))

    def start_cost(self, b: Backend, now: float) -> tuple[float, str]:
        return estimates.start_cost(b, now, self.config, lambda: self.free_wait(b, now))

    def free_wait(self, b: Backend, now: float) -> float:
        """The ``free_wait_s`` of ``b``'s :meth:`best_plan` with nothing booked,
        worked out without the plans' sentences: a plan that starts or waits
        beats any that evicts and has room at once (0), as has every option
        when one waits for another backend's load there (one at a time)."""
        options = self.options(b)
        loads = set[str]()  # the devices where a load runs (Room.loading)
        for name in self.occupying:
            o = self.backends[name]
            if o.state is BackendState.STARTING and o is not b:
                loads.update(o.devices)
        if any(d in loads for gpus, _ in options for d in gpus or (HOST,)):
            return 0.0
        room = self.survey()
        c = self.config
        best: Plan | None = None
        for gpus, need in options:
            plan = placement.plan_on(
                b, None, gpus, need, {}, set(), set(), room, self.devices, c, now, quiet=True
            )
            if plan.status <= Outcome.WAIT:
                return 0.0
            if best is None or plan.key() < best.key():
                best = plan
        return best.free_wait_s if best is not None else 0.0

    def worst_drain(self, b: Backend) -> float:
        """The longest high service estimate of the backends other than ``b``
        (0 where there are none): the drain of
        :func:`~yard.core.estimates.worst_start_cost`, kept (``drains``)
        instead of taken over every backend for every arrival with a start-by."""
        drains = self.drains
        if drains is None or drains[0] != self.room_version:
            top: Backend | None = None
            runner_up: Backend | None = None
            first = second = 0.0
            for o in self.backends.values():
                hi = estimates.service_hi(o, self.config)
                if top is None or hi > first:
                    if top is not None:
                        runner_up, second = top, first
                    top, first = o, hi
                elif runner_up is None or hi > second:
                    runner_up, second = o, hi
            drains = self.drains = (self.room_version, top, first, runner_up, second)
        _, top, first, _, second = drains
        return second if b is top else first

    def service_noted(self, b: Backend) -> None:
        """``b`` noted a service time: its high estimate may have moved, and
        with it the figures :meth:`worst_drain` keeps (where the longest or
        the second longest fell, they are worked out again when asked)."""
        drains = self.drains
        if drains is None or drains[0] != self.room_version:
            return
        version, top, first, runner_up, second = drains
        hi = estimates.service_hi(b, self.config)
        if b is top:
            if hi >= first:
                self.drains = (version, b, hi, runner_up, second)
                return
        elif b is runner_up and hi < second:
            pass  # the second longest fell
        elif hi > first:
            self.drains = (version, b, hi, top, first)
            return
        elif b is runner_up or hi > second:
            self.drains = (version, top, first, b, hi)
            return
        else:
            return  # below the second longest before and after
        self.drains = None

    def stop(self, b: Backend, reason: str, out: list[Decision]) -> None:
        self.transition(b, Move.STOP, reason)
        b.drain_reason = None
        b.idle_since = None
        out.append(StopBackend(backend=b.name, reason=f"stopping {b.name}: {reason}"))

    def survey(self) -> Room:
        return placement.survey(self.devices, self._occupying())

    def best_plan(
        self,
        b: Backend,
        head: Req | None,
        booked: dict[str, int],
        claimed: set[str],
        taken: set[str],
        now: float,
        room: Room | None = None,
        reads: Reads | None = None,
    ) -> Plan | None:
        """``b``'s best plan after what a round ``booked``, ``claimed`` and
        ``taken`` (see :func:`yard.core.placement.best_plan`)."""
        return placement.best_plan(
            b,
            head,
            self.options(b),
            booked,
            claimed,
            taken,
            room if room is not None else self.survey(),
            self.devices,
            self.config,
            now,
            reads,
        )

    def waiting_reason(self, req: Req, now: float, ahead: int) -> str:
        b = self.backends[req.backend]
        swap_head = self.victim_of.get(b.name)
        return views.waiting_reason(req, b, swap_head, self.config, now, ahead, self.start_cost_s)

    def start_cost_s(self, b: Backend, now: float) -> float:
        return self.start_cost(b, now)[0]

    def timer_live(self, kind: Timer, key: str, token: int) -> bool:
        if kind is Timer.IDLE:
            b = self.backends.get(key)  # None: removed from the configuration since
            return b is not None and b.idle_token == token and b.idle_since is not None
        if kind in (Timer.HOLD, Timer.AHEAD, Timer.CLOSE):
            return self.windows.live(kind, key, token, self.requests)
        req = self.requests.get(key)
        if req is None or req.gen != token:
            return False
        if kind is Timer.URGENT:
            return req.state is ReqState.QUEUED and not req.urgent
        if kind is Timer.DEADLINE:
            return req.state is ReqState.QUEUED and not req.deadline_met
        return req.state is ReqState.LOST

    def start(self, plan: Plan, now: float, out: list[Decision]) -> None:
        b = plan.backend
        measure = b.profile is None
        head = b.queue.head()
        next_up = (head.id, head.priority) if head is not None else None
        why = reasons.start_why(b.name, b.queue.size, next_up, b.pinned)
        if head is None and b.ahead is not None:
            why = b.ahead_load_why
        elif head is None and not b.pinned:
            loan = self.loans.get(b.name)
            if loan is not None and loan.wished:
                why = reasons.giving_back(b.name, loan.borrower, loan.app)
        self.transition(b, Move.START, f"loading: {why}")
        b.gpus = plan.gpus
        b.devices = (*plan.gpus, HOST)
        self.touched_devices.update(b.devices)
        self.touched_devices.update(loading(d) for d in b.devices)
        # A first load holds its estimate (the prior) until measured, or
        # nothing: its live use, whichever is higher (Backend.held).
        b.reserved = {} if measure and b.estimate is None else dict(plan.need)
        b.live = {}
        b.loading = ""
        b.measuring = measure
        b.started_at = now
        b.ready_at = None
        b.want_load = False
        self.note_use(b)
        b.overcommit = None
        for d in b.devices:
            for o in self.occupants(d):
                if o is not b and o.state is BackendState.STARTING:
                    text = f"{o.name} and {b.name} were loading on {d} at the same time"
                    o.overcommit = o.overcommit or text
                    b.overcommit = b.overcommit or text
        b.context = plan.context
        b.parallel = plan.parallel
        b.served_context = None
        placed = plan.reason
        if measure:
            alone = any(placement.loads_alone(b, self.devices[d].spec) for d in b.primary)
            placed += f" ({reasons.first_load(alone)})"
        reason = f"starting {b.name}: {why}; {placed}"
        out.append(
            StartBackend(
                backend=b.name,
                gpus=plan.gpus,
                measure=measure,
                context=plan.context,
                parallel=plan.parallel,
                reason=reason,
            )
        )


def _need(b: Backend, gpus: tuple[str, ...], margin: float) -> dict[str, int]:
    """The reservation on each device of a placement on ``gpus`` (0s while
    unmeasured with no prior), at its required context and slot count where it
    has ranges."""
    context, parallel = resources.required(b.spec, b.estimate, gpus)
    return resources.need_at(b.estimate, gpus, margin, context, parallel)
