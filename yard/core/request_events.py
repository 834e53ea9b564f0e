"""What the scheduler does when a request arrives, is cancelled or finishes, and
when one of its timers comes due (urgency, a passed start-by, a lost upstream).

Functions of the :class:`~yard.core.state.Core` they change; each appends its
decisions to ``out``. The pass that follows every event dispatches and plans.
"""

from __future__ import annotations

from yard.core import estimates, instances, reasons, windows
from yard.core.decisions import Decision, Flag, Reject
from yard.core.events import RequestArrived, RequestCancelled, RequestFinished
from yard.core.lifecycle import BackendState
from yard.core.queue import Req, ReqState, aging_start
from yard.core.state import Core
from yard.core.timers import Due, Timer

_EWMA_ALPHA = 0.3
"""Weight of the newest service time in the moving average."""
_START_BY_SLACK_S = 0.05
"""A start-by this little before the arrival is handled still counts as met by
a start at once: ``X-Yard-Start-Within: 0`` is turned into an engine time
before the core sees the arrival, a moment later."""


def arrived(core: Core, ev: RequestArrived, now: float, out: list[Decision]) -> None:
    c = core.config
    rid = ev.request_id
    if rid in core.requests:
        out.append(Flag(request_id=rid, reason=f"ignored a second arrival of {rid}"))
        return
    b = core.backends.get(ev.backend)
    if b is None:
        msg = reasons.unknown_backend(ev.backend, list(core.backends))
        reason = f"{rid}: unknown backend {ev.backend!r}"
        out.append(
            Reject(request_id=rid, status=404, code="model_not_found", message=msg, reason=reason)
        )
        return
    fits, why = core.fits_empty_machine(b)
    if not fits:
        out.append(_reject_new(rid, 503, "does_not_fit", why))
        return
    if b.gave_up is not None and b.profile is None:
        # Never the same failing start twice: until other processes free some
        # of what they held then, it would run out of memory again.
        why, foreign_then = b.gave_up
        if all(core.devices[d].foreign >= n for d, n in foreign_then.items()):
            out.append(_reject_new(rid, 503, "does_not_fit", why))
            return
        b.gave_up = None
        b.self_caused_start_failures = 0
        b.failed_starts.clear()
    if core.queued + core.windows.held_count() >= c.queue_limit and not ev.requeued:
        retry = core.service_est(b)
        out.append(
            Reject(
                request_id=rid,
                status=503,
                code="queue_full",
                message=reasons.queue_full(core.queued, c.queue_limit, retry),
                retry_after_s=retry,
                reason=f"{rid}: queue full ({core.queued} waiting)",
            )
        )
        return
    if core.windows.by_backend:
        windows.match(core, ev, now, out)
    if ev.not_before is not None and ev.not_before > now:
        windows.hold(core, ev, now)
        return
    enter(core, ev, now, out)


def enter(core: Core, ev: RequestArrived, now: float, out: list[Decision]) -> None:
    """Enter an admitted request into its backend's queue (at its arrival, or
    when its not-before comes): its start-by is checked and timed from now. A
    request for a backend with several instances is bound to one of them here
    (:func:`yard.core.instances.route`)."""
    c = core.config
    rid = ev.request_id
    b = core.backends[ev.backend]
    if b.spec.instances > 1 and b.spec.instance_of is None:
        b = instances.route(core, b, rid, now, out)
    arrived = now if ev.arrived_at is None else min(ev.arrived_at, now)
    if ev.not_before is not None:
        # Aging counts from the window's opening (docs/wait-bound.md).
        arrived = max(arrived, min(ev.not_before, now))
    prio = min(max(ev.priority, c.min_priority), c.max_priority)
    aging_from = arrived
    if ev.start_by is not None:
        aging_from = aging_start(arrived, ev.start_by, c.patient_aging_s)
        if aging_from > arrived:
            why = reasons.patient(rid, aging_from - now, ev.start_by - aging_from, b.spec.slots)
            out.append(Flag(request_id=rid, backend=b.name, reason=why))
    req = Req(
        id=rid,
        backend=b.name,
        priority=prio,
        app=ev.app,
        arrived_at=arrived,
        rank=prio - c.aging_rate * aging_from,
        start_by=ev.start_by,
        allow_late=ev.allow_late,
        requeued=ev.requeued,
        ages_from=aging_from if aging_from > arrived else None,
    )
    if ev.start_by is not None:
        cost, how = core.start_cost(b, now)
        if now + cost > ev.start_by + _START_BY_SLACK_S:
            msg = reasons.deadline_infeasible(cost, how, now + cost - ev.start_by)
            if not ev.allow_late:
                out.append(_reject_new(rid, 409, "deadline_infeasible", msg))
                return
            req.late_flagged = True
            out.append(Flag(request_id=rid, backend=b.name, reason=f"accepted late: {msg}"))
        worst = estimates.worst_start_cost(b, core.worst_drain(b), c)
        req.urgent_at = ev.start_by - worst - c.urgency_window_s
        if req.urgent_at <= now:
            req.urgent = True
        else:
            core.timers.set(req.urgent_at, Timer.URGENT, rid, req.gen)
        core.timers.set(ev.start_by, Timer.DEADLINE, rid, req.gen)
    if core.shares is not None:
        cost = core.service_est(b)
        req.share_tag, points = core.shares.arrive(req.app, cost, alone=not core.queued)
        req.rank -= points
    core.requests[rid] = req
    b.queue.push(req)
    b.note_arrival(now)  # its place in the eviction order (victims.demand)
    b.last_app = req.app
    core.touched.add(b.name)
    core.queued += 1


def cancelled(core: Core, ev: RequestCancelled, now: float, out: list[Decision]) -> None:
    req = core.requests.get(ev.request_id)
    if req is None:
        return
    if req.state is ReqState.QUEUED:
        core.unqueue(req)
    elif req.state is ReqState.HELD:
        windows.unhold(core, req, now)
    else:
        b = core.backends[req.backend]
        b.running.pop(req.id, None)
        b.last_used = now
        core.touched.add(b.name)
        instances.rebind(core, b, out)
    req.state = ReqState.DONE
    del core.requests[req.id]


def finished(core: Core, ev: RequestFinished, now: float, out: list[Decision]) -> None:
    req = core.requests.get(ev.request_id)
    if req is None or req.state is not ReqState.RUNNING:
        return  # late or duplicate report
    b = core.backends[req.backend]
    if ev.outcome == "upstream_lost":
        # Keep the slot: the backend is probably dying; its exit report
        # decides whether yard caused it.
        req.state = ReqState.LOST
        req.lost_at = now
        core.timers.set(now + core.config.lost_grace_s, Timer.LOST, req.id, req.gen)
        return
    assert req.dispatched_at is not None
    sample = now - req.dispatched_at
    b.service_ewma = (
        sample
        if b.service_ewma is None
        else (1 - _EWMA_ALPHA) * b.service_ewma + _EWMA_ALPHA * sample
    )
    b.service_max = sample if b.service_max is None else max(b.service_max, sample)
    b.note_service(sample)
    core.service_noted(b)
    b.running.pop(req.id, None)
    b.served += 1
    b.last_used = now
    core.touched.add(b.name)
    req.state = ReqState.DONE
    del core.requests[req.id]
    instances.rebind(core, b, out)
    windows.service_changed(core, b.name, now)


def timer(core: Core, due: Due, now: float, out: list[Decision]) -> None:
    if due.kind is Timer.IDLE:
        b = core.backends[due.key]
        if b.state is BackendState.READY and not b.running and not b.queue.size:
            if b.ahead is not None:
                # Kept for work ahead; idle from when that ends (yard.core.windows).
                out.append(Flag(backend=b.name, reason=b.ahead_keep_why))
                return
            assert b.spec.idle_ttl_s is not None
            idle = now - (b.idle_since or now)
            core.stop(b, reasons.idle_stop(idle, b.spec.idle_ttl_s), out)
        return
    if due.kind is Timer.HOLD:
        enter(core, windows.release(core, due.key, now), now, out)
        return
    if due.kind in (Timer.AHEAD, Timer.CLOSE):
        windows.timer(core, due.kind, due.key, now, out)
        return
    req = core.requests[due.key]
    b = core.backends[req.backend]
    if due.kind is Timer.URGENT:
        b.queue.make_urgent(req)
        core.touched.add(b.name)
    elif due.kind is Timer.DEADLINE:
        if not req.allow_late:
            why = core.waiting_reason(req, now, ahead=0)
            msg = reasons.deadline_missed(now - req.arrived_at, why)
            core.end(req, 504, "deadline_missed", msg, out)
        elif not req.late_flagged:
            req.late_flagged = True
            reason = f"{req.id}: start-by passed; it runs late as asked"
            out.append(Flag(request_id=req.id, backend=b.name, reason=reason))
    else:
        msg = reasons.lost_no_exit(b.name, core.config.lost_grace_s)
        core.end(req, 502, "backend_failed", msg, out)


def _reject_new(rid: str, status: int, code: str, msg: str) -> Reject:
    return Reject(request_id=rid, status=status, code=code, message=msg, reason=f"{rid}: {msg}")
