"""Work the core can see coming: held requests and announcements.

Two kinds of *window* tell the core about work before it can start:

- a **held request** (``RequestArrived.not_before`` later than its arrival): it
  is counted (``queue_limit``) but sits in no queue until ``not_before``, when
  a ``HOLD`` timer lets it join its backend's queue as if it arrived then (its
  aging, and so its wait bound, counts from the window's opening). A start-by
  is checked, and its urgency worked out, at that moment too;
- an **announcement** (``AnnouncementMade``): an app will send ``count``
  requests for a backend inside ``[not_before, start_by)``. Each request of
  that app for that backend whose start may fall inside it (``max(now,
  not_before)``) uses one of its count (the window closing first, then the
  lowest id); it ends ``used`` when the count is gone, ``expired`` when the
  window closes first (a ``CLOSE`` timer), or ``withdrawn``, each with one
  :class:`~yard.core.decisions.AnnouncementEnded`.

Rules it keeps
--------------

- A window is *near* from ``opens - load_s - lead_margin_s`` (the backend's
  measured load time) until it opens (held) or closes (announced). While a
  backend has near windows, the best-ranked of them stands in for a waiting
  request in planning (``Backend.ahead``): a request of the window's priority
  that arrives when the window opens (rank ``priority - aging_rate * opens``).
  The stand-in is never dispatched and never in ``Core.requests``.
- So a stopped backend is loaded ahead exactly as for a waiting request: only
  where it fits, making room only from backends whose waiting work (or own
  stand-in) it outranks, busy ones drained, never killed.
- An announcement is a start-by for its backend's load: the load must start by
  ``opens - load_s`` for the window's requests to find it ready. Where that
  load may have to wait for busy work to drain (the longest recent service of
  the backends it shares a device with), the stand-in is near and *urgent*
  from that long before, less ``lead_margin_s``, until the window closes: it
  ranks with ``deadline_boost`` like an urgent request that came when it
  became urgent (rank ``priority - aging_rate * u``, ``u`` that moment, never
  later than the opening), so the backends it must evict drain in time and
  take no new work that would run past its load (no swap batching). Ranked
  from the opening instead, work queued a few minutes before the window
  outranked it and ran into the load: the window's requests waited for a job
  dispatched just before their load was due. Like a request's, the boost is
  bounded: work that had waited past it when the stand-in became urgent still
  goes first (``docs/wait-bound.md``). The urgent time follows the neighbours'
  service times (:func:`service_changed`); once urgent, a stand-in stays so.
- Urgency is for draining: until the load is due (``opens - load_s -
  lead_margin_s``, when a window that is not urgent loads too) an urgent
  stand-in's plan holds its idle victims (loaded, no new work it outranks)
  instead of stopping them, and an ``AHEAD`` timer wakes the core when the load
  is due. A held victim still takes the requests expected to end (its mean
  service time) by the time the load is due
  (:func:`yard.core.placement.ends_before`): its memory serves meanwhile, and
  only what would run into the load waits for the window. A request that
  outranks the stand-in is served by the held backend as it is, instead of
  evicting the backend loaded early and loading it once more
  (:func:`yard.core.placement.load_due`). A load that a waiting request needs
  too (one for the window's backend, ranked below its stand-in) is not held: it
  starts at once.
- A loaded backend with a near window is kept: it is not stopped when idle, and
  no load for work that does not outrank its stand-in may evict it.
- Early: up to ``EARLY_S`` (half an hour) before a window opens, a stopped
  backend that must evict to load is let near at once, once per window, where
  what it must evict is idle and expected to stay so until the window opens
  (:func:`yard.core.estimates.idle_from`, from the gaps between its requests):
  image after the show art, not music at night nor chat. Then its load is due
  at once (no hold), and it is ready for work that comes unannounced before
  the window. Once loaded it is near no longer until its time. Asked again
  when the forecast says, and when a neighbour on its devices becomes idle.
- A backend that fails to start gives up on the windows near at that moment
  (no load loop); requests that come still load it as usual.
- A backend with several instances: where the work near is more than the
  first instance's slots, further instances get stand-ins of their own
  (:func:`yard.core.instances.spread`); one that fails to start gives up on
  the windows near then (``Window.gave_up_on``).
- Without windows nothing here runs: decisions are those of a core without it.
"""

from __future__ import annotations

import math
from typing import Literal

from yard.core import early, estimates, instances, reasons
from yard.core.decisions import AnnouncementEnded, Decision, Flag
from yard.core.events import AnnouncementMade, AnnouncementWithdrawn, RequestArrived
from yard.core.lifecycle import BackendState
from yard.core.queue import Req, ReqState, order_key
from yard.core.records import Backend
from yard.core.spec import HOST
from yard.core.state import Core
from yard.core.timers import Timer
from yard.core.views import WindowView
from yard.core.window_state import Kind, Window

EARLY_S = 1800.0
"""How long before a window opens its backend may load early (:func:`yard.core.early.early_at`)."""

# -- held requests ------------------------------------------------------------


def hold(core: Core, ev: RequestArrived, now: float) -> None:
    """Hold a request whose ``not_before`` is later than ``now``."""
    assert ev.not_before is not None
    c = core.config
    opens = ev.not_before
    prio = min(max(ev.priority, c.min_priority), c.max_priority)
    req = Req(
        id=ev.request_id,
        backend=ev.backend,
        priority=prio,
        app=ev.app,
        arrived_at=now if ev.arrived_at is None else min(ev.arrived_at, now),
        rank=prio - c.aging_rate * opens,
        start_by=ev.start_by,
        allow_late=ev.allow_late,
        requeued=ev.requeued,
        state=ReqState.HELD,
    )
    core.requests[req.id] = req
    core.windows.held[req.id] = ev
    key = "held:" + req.id
    _add(
        core, _window(core, key, "held", ev.app, ev.backend, opens, opens, prio, 1, ev.window_label)
    )
    core.timers.set(opens, Timer.HOLD, req.id, req.gen)
    _refresh(core, ev.backend, now)


def release(core: Core, request_id: str, now: float) -> RequestArrived:
    """The held request's window opened: what to enter into the queue now."""
    ev = core.windows.held.pop(request_id)
    del core.requests[request_id]
    _drop(core, "held:" + request_id)
    _refresh(core, ev.backend, now)
    return ev


def unhold(core: Core, req: Req, now: float) -> None:
    """A held request was cancelled."""
    core.windows.held.pop(req.id, None)
    _drop(core, "held:" + req.id)
    _refresh(core, req.backend, now)


def held_opens(core: Core, req: Req) -> float:
    """When a held request's window opens."""
    opens = core.windows.held[req.id].not_before
    assert opens is not None
    return opens


def held_reason(core: Core, req: Req, now: float) -> str:
    """Why a held request waits: "held until 13:50:00Z (X-Yard-Not-Before)"."""
    ev = core.windows.held[req.id]
    if ev.window_label:
        return reasons.held_until(ev.window_label)
    return reasons.held_for(held_opens(core, req) - now)


# -- announcements ------------------------------------------------------------


def announce(core: Core, ev: AnnouncementMade, now: float, out: list[Decision]) -> None:
    w = core.windows
    aid = ev.announcement_id
    if aid in w.announced:
        out.append(Flag(reason=f"ignored a second announcement {aid}"))
        return
    if ev.backend not in core.backends:
        text = reasons.unknown_backend(ev.backend, list(core.backends))
        out.append(_ended(aid, ev.app, ev.backend, "expired", ev.used, text))
        return
    if ev.used >= ev.count or ev.start_by <= now:
        outcome: Literal["used", "expired"] = "used" if ev.used >= ev.count else "expired"
        text = reasons.announcement_ended(aid, ev.backend, outcome, ev.used, ev.count)
        out.append(_ended(aid, ev.app, ev.backend, outcome, ev.used, text))
        return
    c = core.config
    prio = min(max(ev.priority, c.min_priority), c.max_priority)
    win = _window(
        core,
        aid,
        "announced",
        ev.app,
        ev.backend,
        ev.not_before,
        ev.start_by,
        prio,
        ev.count - ev.used,
        ev.label,
    )
    win.used = ev.used
    w.announced[aid] = win
    _add(core, win)
    core.timers.set(ev.start_by, Timer.CLOSE, aid, 0)
    _refresh(core, ev.backend, now)


def withdraw(core: Core, ev: AnnouncementWithdrawn, now: float, out: list[Decision]) -> None:
    win = core.windows.announced.get(ev.announcement_id)
    if win is None:
        return
    _end(core, win, "withdrawn", now, out)


def match(core: Core, ev: RequestArrived, now: float, out: list[Decision]) -> None:
    """Count an arriving request against the announcement it was announced by."""
    wins = core.windows.by_backend.get(ev.backend)
    if not wins:
        return
    t = now if ev.not_before is None else max(now, ev.not_before)
    best: Window | None = None
    for win in wins.values():
        if (
            win.kind == "announced"
            and win.app == ev.app
            and win.opens <= t < win.closes
            and (best is None or (win.closes, win.id) < (best.closes, best.id))
        ):
            best = win
    if best is None:
        return
    best.left -= 1
    best.used += 1
    text = reasons.announcement_matched(ev.request_id, best.id, best.left)
    out.append(Flag(request_id=ev.request_id, backend=ev.backend, reason=text))
    if best.left <= 0:
        _end(core, best, "used", now, out)
    else:
        _describe(core, core.backends[best.backend], now)


def _end(
    core: Core,
    win: Window,
    outcome: Literal["used", "expired", "withdrawn"],
    now: float,
    out: list[Decision],
) -> None:
    del core.windows.announced[win.id]
    _drop(core, win.id)
    total = win.used + win.left
    text = reasons.announcement_ended(win.id, win.backend, outcome, win.used, total)
    out.append(_ended(win.id, win.app, win.backend, outcome, win.used, text))
    _refresh(core, win.backend, now)


def _ended(
    aid: str,
    app: str,
    backend: str,
    outcome: Literal["used", "expired", "withdrawn"],
    used: int,
    text: str,
) -> AnnouncementEnded:
    return AnnouncementEnded(
        announcement_id=aid, app=app, backend=backend, outcome=outcome, used=used, reason=text
    )


# -- timers and failures ------------------------------------------------------


def timer(core: Core, kind: Timer, key: str, now: float, out: list[Decision]) -> None:
    """An ``AHEAD`` or ``CLOSE`` timer came due (``HOLD``: see :func:`release`)."""
    if kind is Timer.CLOSE:
        _end(core, core.windows.announced[key], "expired", now, out)
    else:
        core.windows.ahead_at.pop(key, None)
        _refresh(core, key, now)


def start_failed(core: Core, b: Backend, now: float) -> None:
    """``b`` failed to start: give up loading ahead for the windows near now
    (on a further instance readied for its first's windows: that instance
    gives up on them)."""
    first = b.spec.instance_of
    spread = core.windows.by_backend.get(first) if first is not None else None
    if first is not None and spread:
        for win in spread.values():
            if _near_at(core, core.backends[first], win) <= now:
                win.gave_up_on.add(b.name)
        _refresh(core, first, now)
    wins = core.windows.by_backend.get(b.name)
    if not wins:
        return
    for win in wins.values():
        if _near_at(core, b, win) <= now:
            win.gave_up = True
    _refresh(core, b.name, now)


def ready(core: Core, b: Backend, now: float) -> None:
    """``b`` is loaded: a window that let it load early is near no longer
    until its time (it is kept no more than any idle backend till then)."""
    wins = core.windows.by_backend.get(b.name)
    if wins and any(w.stand_in.early for w in wins.values()):
        for win in wins.values():
            win.stand_in.early = False
        core.touched.add(b.name)
        _refresh(core, b.name, now)


def profile_changed(core: Core, name: str, now: float) -> None:
    """Backend ``name``'s load time may have changed, and with it when its
    windows are near (an instance's: its first's windows, which it may be
    readied for)."""
    if core.windows.by_backend.get(name):
        _refresh(core, name, now)
    b = core.backends.get(name)
    first = b.spec.instance_of if b is not None else None
    if first is not None and core.windows.by_backend.get(first):
        _refresh(core, first, now)


def service_changed(core: Core, name: str, now: float) -> None:
    """Backend ``name``'s service times changed, and with them how long it may
    take to drain: when the announced windows not yet urgent of the backends
    sharing a device with it become urgent (:func:`_urgent_at` counts only
    those; the others' are unchanged). Where it is idle now, whether their
    backends may load early is asked again (:func:`yard.core.early.early_at`)."""
    if not core.windows.announced:
        return
    b = core.backends[name]
    mine = _devices(b)
    idle = not b.running and not b.queue.size
    for backend, wins in list(core.windows.by_backend.items()):
        if backend == name or not mine & _devices(core.backends[backend]):
            continue
        urgent_later = any(
            w.kind == "announced" and not w.stand_in.urgent and not w.gave_up for w in wins.values()
        )
        # Idle now, it may be one that lets a load ahead come early (early.early_at).
        early_later = False
        for w in wins.values() if idle else ():
            if not w.early and w.early_check > now and now >= w.opens - EARLY_S:
                w.early_check = now
                early_later = True
        if urgent_later or early_later:
            _refresh(core, backend, now)


# -- what people see -----------------------------------------------------------


def window_views(core: Core) -> tuple[WindowView, ...]:
    """Every window ahead (held requests, announcements), by opening time."""
    out = [
        WindowView(
            id=win.id,
            kind=win.kind,
            app=win.app,
            backend=win.backend,
            opens=win.opens,
            closes=win.closes,
            priority=win.priority,
            left=win.left,
            loads_from=_counts_from(core, core.backends[win.backend], win),
            label=win.label,
        )
        for wins in core.windows.by_backend.values()
        for win in wins.values()
    ]
    out.sort(key=lambda v: (v.opens, v.id))
    return tuple(out)


# -- what planning sees -------------------------------------------------------


def _window(
    core: Core,
    wid: str,
    kind: Kind,
    app: str,
    backend: str,
    opens: float,
    closes: float,
    prio: float,
    left: int,
    label: str,
) -> Window:
    stand_in = Req(
        id=f"{kind}:{wid}" if kind == "announced" else wid,
        backend=backend,
        priority=prio,
        app=app,
        arrived_at=opens,
        rank=prio - core.config.aging_rate * opens,
        start_by=None,
        allow_late=False,
        requeued=False,
    )
    return Window(wid, kind, app, backend, opens, closes, prio, left, 0, label, stand_in)


def _add(core: Core, win: Window) -> None:
    core.windows.by_backend.setdefault(win.backend, {})[win.id] = win


def _drop(core: Core, wid: str) -> None:
    for wins in core.windows.by_backend.values():
        if wins.pop(wid, None) is not None:
            return


def _near_at(core: Core, b: Backend, win: Window) -> float:
    """When ``win`` becomes near: ``lead_margin_s`` before its load must start,
    or earlier where its urgency comes first (an urgent stand-in is near), or
    where it was let near early (:func:`yard.core.early.early_at`)."""
    if win.stand_in.urgent or win.stand_in.early:
        return -math.inf
    return _counts_from(core, b, win)


def _counts_from(core: Core, b: Backend, win: Window) -> float:
    """When ``win`` counts for a load ahead, as the views show it (a time, also
    once it is urgent): ``lead_margin_s`` before its load must start, or its
    urgency where that comes first."""
    return min(_due_at(core, b, win), _urgent_at(core, b, win))


def _due_at(core: Core, b: Backend, win: Window) -> float:
    """When ``win``'s load must start, with ``lead_margin_s`` to spare."""
    return win.opens - core.load_s(b) - core.config.lead_margin_s


def _devices(b: Backend) -> set[str]:
    """The devices ``b``'s loads may take memory on (its GPUs, else the host)."""
    return set(b.spec.gpus) or {HOST}


def _urgent_at(core: Core, b: Backend, win: Window) -> float:
    """When an announced window's stand-in becomes urgent: where its load may
    have to wait for busy work to drain, that long before its load must start
    (``opens - load_s``), with the same ``lead_margin_s``; the drain is the
    longest recent service of the backends its loads share a device with.
    Never where none of them has served (nothing to drain: it is loaded ahead
    when near, as before), nor for a held request (its own start-by counts
    from its release)."""
    if win.kind != "announced":
        return math.inf
    devs = _devices(b)
    drain = max(
        (
            estimates.service_hi(o, core.config)
            for o in core.backends.values()
            if o is not b and o.service_recent and devs & _devices(o)
        ),
        default=0.0,
    )
    if drain <= 0:
        return math.inf
    return win.opens - core.load_s(b) - drain - core.config.lead_margin_s


def _refresh(core: Core, name: str, now: float) -> None:
    """Work out ``name``'s stand-in and when its next window becomes near."""
    b = core.backends[name]
    w = core.windows
    wins = w.by_backend.get(name, {})
    best: Window | None = None
    soonest = math.inf
    boost = core.config.deadline_boost
    near: list[Window] = []
    for win in wins.values():
        if win.gave_up:
            continue
        if not win.stand_in.urgent and _urgent_at(core, b, win) <= now:
            # Its load must start soon for the window to find it ready: from now
            # on it ranks as an urgent deadline that came now (boosted; no swap
            # batching), and stays so until the window closes, as a late request
            # would.
            win.stand_in.urgent = True
            win.stand_in.rank = win.priority - core.config.aging_rate * min(now, win.opens)
            core.touched.add(name)
        near_at = _near_at(core, b, win)
        # not loaded for it yet: not near, or urgent and holding till its load is due
        waits = near_at > now or (win.stand_in.urgent and _due_at(core, b, win) > now)
        if waits and not win.early and now >= win.opens - EARLY_S:
            if now >= win.early_check:
                at = win.early_check = early.early_at(core, b, win, now)
                if at <= now:
                    # What its load evicts is idle and expected to stay so
                    # until the window: loaded now, it is ready for work that
                    # comes unannounced before the window too (seed 3's
                    # breaking news). Once only: a wrong forecast costs one
                    # load more, and no loop.
                    win.early = win.stand_in.early = True
                    core.touched.add(name)
                    near_at = -math.inf
            if not win.early and win.early_check < math.inf:
                soonest = min(soonest, win.early_check)
        elif waits and not win.early:
            soonest = min(soonest, win.opens - EARLY_S)
        if near_at > now:
            soonest = min(soonest, near_at)
            continue
        if not win.stand_in.urgent:
            soonest = min(soonest, _urgent_at(core, b, win))
        elif _due_at(core, b, win) > now:
            # Its plan holds idle victims until then (placement.load_due).
            soonest = min(soonest, _due_at(core, b, win))
        near.append(win)
        if best is None or order_key(win.stand_in, boost) < order_key(best.stand_in, boost):
            best = win
    if not wins:
        w.by_backend.pop(name, None)
    ahead = best.stand_in if best is not None else None
    if ahead is not b.ahead:
        core.touched.add(name)
        if ahead is None and b.state is BackendState.READY and b.idle_since is not None:
            b.idle_since = None  # idle from now: its idle timer starts again
        b.ahead = ahead
    if soonest < math.inf and w.ahead_at.get(name) != soonest:
        token = w.ahead_token.get(name, 0) + 1
        w.ahead_token[name] = token
        w.ahead_at[name] = soonest
        core.timers.set(soonest, Timer.AHEAD, name, token)
    _describe(core, b, now)
    if b.family is not None and b.spec.instance_of is None and b.spec.spread_windows:
        instances.spread(core, b, near, now)


def _describe(core: Core, b: Backend, now: float) -> None:
    """The sentences a load for ``b``'s stand-in and a refusal to evict it give."""
    keep = b.ahead_keep_why
    if b.ahead is None:
        b.ahead_load_why = b.ahead_keep_why = ""
        return
    wins = core.windows.by_backend[b.name]
    win = next(w for w in wins.values() if w.stand_in is b.ahead)
    # Everything near for it, counted together: "3 announced requests from 13:50".
    near = [w for w in wins.values() if not w.gave_up and _near_at(core, b, w) <= now]
    announced = sum(w.left for w in near if w.kind == "announced")
    held = sum(1 for w in near if w.kind == "held")
    first = min(near, key=lambda w: (w.opens, w.id))
    when = first.label or reasons.in_s(first.opens - now)
    b.ahead_load_why = reasons.loading_ahead(b.name, announced, held, when, win.id)
    if win.stand_in.early:
        b.ahead_load_why += reasons.ahead_early(win.label or when)
    elif win.stand_in.urgent:
        b.ahead_load_why += reasons.ahead_urgent(core.load_s(b), win.label or when)
    b.ahead_keep_why = reasons.keeping_ahead(b.name, announced, held, when, core.load_s(b))
    if b.ahead_keep_why != keep:
        core.touched.add(b.name)  # plans that read it refused to evict it with these words
