"""Several instances of one backend: which one a request goes to, and what they share.

A backend with ``instances = N`` is N backends to the rest of the core (the first
with the configured name, the others ``NAME@2`` ... ``NAME@N``, see
:func:`yard.core.spec.instance_name`): each has its own lifecycle, queue, slots and
placement, so planning, dispatch, eviction and the views need nothing new. What is
new lives here.

Rules it keeps
--------------

- **Routing at entry.** A request that names the first instance is bound, when it
  enters the queue (at its arrival, or when its not-before comes), to the ONE
  instance where it is expected to start soonest (:func:`expected_wait`, first
  come first served at the mean service time, which the instances share): a
  free slot now; else when a slot frees (what the running requests have left
  of the mean, at least a tenth of it), then the queue ahead; for a loading
  instance the rest of its load, then its queue; for one not loaded
  :meth:`Core.start_cost` (its load time, plus the time to make room), then its
  queue, and a fraction of its start more (the backend's or the scheduler's
  ``instance_load_penalty``, a quarter by default: a load costs more than this
  request's wait). Ties go to the lower-numbered instance. So a
  further instance gets requests, and the planner loads it for them, only when
  the ones loaded are busy for clearly longer than a load takes. A request that
  names a further instance (``/backends/NAME@2/...``) is bound to it as it is.
- **Who may take one.** A further instance never takes the first load of a
  backend (it waits for the first's measured profile, which all share), nor a
  request while it is draining or stopping, nor one while it cannot fit beside
  the instances already holding memory (so that one instance never makes room by
  evicting another: on a GPU that holds one copy, the second copy is not an
  option). The first instance always may: with no other option it takes the
  request, as a backend without instances would.
- **Bound early; moved only off an instance not started.** A request stays on
  the instance it was bound to once that instance is loading or loaded: its
  place in that queue is its place, and a load under way is not thrown away
  (one bound to a loading second instance does not move back if the first
  frees meanwhile; it starts once the second is ready, at most the rest of its
  load later). One bound to an instance whose load has not begun (it waits for
  memory to be freed) moves to a sibling the moment that one is ready with a
  slot its own queue does not fill (:func:`rebind`: when a request there ends,
  or it becomes ready), best-ranked first, keeping its rank, start-by and
  urgency: no instance is loaded, and nothing evicted, for requests a loaded
  one can take. A requeue after a self-caused out-of-memory keeps its
  instance, as it keeps its place.
- **One profile.** The instances run the same command on the same model: a
  profile measured, raised or forgotten for one is the profile of all
  (:func:`share_profile`). Until the first load has measured it, a further
  instance is loaded for no wish (``pinned``, an operator's load:
  :func:`awaits_profile`), only for a request sent to it by name.
- **Work ahead spreads by slots.** Windows name the first instance, which is
  loaded ahead of them as any backend; where the work near (an announcement's
  whole count, a held request one) is more than the slots of the instances
  before a further one, that one is readied too, with a stand-in of its own
  (:func:`spread`), loaded and kept by the same rules. No load that no request
  waits for (work ahead, a pin, an operator's load) evicts a sibling
  (:func:`yard.core.victims.family_of`).
- **An operator's name is the whole backend.** ``/admin/backends/NAME/unload``,
  ``pin`` and ``unpin`` act on every instance they change, ``load`` loads the
  first not loaded; ``NAME@K`` is one instance (:func:`admin_targets`).

A request that will wait where it is bound gets a ``Flag`` naming the instance
chosen, what each option was expected to cost and why any other instance was not
one (a request that starts at once on the first instance gets none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from yard.core import reasons
from yard.core.decisions import Decision, Flag
from yard.core.lifecycle import OCCUPYING, BackendState
from yard.core.queue import Req, order_key
from yard.core.records import Backend
from yard.core.spec import (
    INSTANCE_LOAD_PENALTY,
    INSTANCE_SEPARATOR,
    first_instance,
    instance_name,
    instance_number,
)
from yard.core.state import Core
from yard.core.timers import Timer
from yard.core.views import BackendView
from yard.core.window_state import Window


@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """One instance a request could be bound to.

    name: the instance. wait_s: expected seconds until the request could start
    there (:func:`expected_wait`). load_s: for an instance not loaded, what
    its start is expected to take; 0 otherwise. penalty: the fraction of
    ``load_s`` counted against the option (:func:`load_penalty`). how: why,
    for people.
    """

    name: str
    wait_s: float
    how: str
    load_s: float = 0.0
    penalty: float = INSTANCE_LOAD_PENALTY

    @property
    def cost_s(self) -> float:
        """What :func:`choose` compares: the wait, plus the penalty of a load."""
        return self.wait_s + self.penalty * self.load_s


def load_penalty(core: Core, b: Backend) -> float:
    """The fraction of a start counted against loading an instance of ``b``:
    its backend's ``instance_load_penalty``, else the scheduler's
    (:attr:`~yard.core.spec.SchedulerConfig.instance_load_penalty`; a start
    takes the GPU for its load and usually evicts a backend that comes back
    later, so an instance that must be loaded is chosen only when it saves more
    than this fraction of its start)."""
    own = b.spec.instance_load_penalty
    return core.config.instance_load_penalty if own is None else own


def expected_wait(
    *,
    load_left_s: float,
    slots: int,
    remaining: Sequence[float],
    queued: int,
    service_s: float,
) -> float:
    """Expected seconds until a new request could start on one instance.

    load_left_s: 0 for a loaded instance; the rest of its load for one loading;
        the whole start (load, plus making room) for one not loaded.
    slots: how many requests it serves at once.
    remaining: for each request it serves now, the seconds it should still hold
        its slot.
    queued: the requests waiting for it (as far as this estimate goes, all ahead
        of the new one).
    service_s: the mean seconds one request holds a slot.

    First come, first served on ``slots`` slots, each request ``service_s``:
    every slot is free at ``load_left_s`` plus what its running request has left;
    the requests waiting take the slots as they free, a round of ``slots`` at a
    time, and the new one takes the next.
    """
    free_at = sorted(
        [load_left_s] * max(0, slots - len(remaining)) + [load_left_s + r for r in remaining]
    )
    rounds, k = divmod(queued, len(free_at))
    return free_at[k] + rounds * service_s


def choose(options: Sequence[Option]) -> Option:
    """The option with the least expected wait (an instance to be loaded counts
    its ``penalty`` of its start on top); on a tie the first listed (the
    lower-numbered instance). ``options`` must not be empty."""
    best = options[0]
    for option in options[1:]:
        if option.cost_s < best.cost_s:
            best = option
    return best


def members(core: Core, b: Backend) -> list[Backend]:
    """Every instance of ``b``'s backend, the first first (``[b]`` for a backend
    with one instance)."""
    first = b.spec.instance_of or b.name
    names = (instance_name(first, k) for k in range(1, b.spec.instances + 1))
    return [core.backends[n] for n in names if n in core.backends]


def route(core: Core, first: Backend, rid: str, now: float, out: list[Decision]) -> Backend:
    """The instance of ``first`` (a backend with several) that request ``rid``
    is bound to, by the rules above; a ``Flag`` says why when there was a choice."""
    group = members(core, first)
    service = _service_s(core, group)
    penalty = load_penalty(core, first)
    options: list[Option] = []
    skipped: list[str] = []
    for b in group:
        option, why = _option(core, b, group, service, penalty, now)
        if option is not None:
            options.append(option)
        elif why:
            skipped.append(f"{b.name} {why}")
    if not options:
        return first
    chosen = choose(options)
    if (len(options) > 1 or skipped) and (chosen.name != first.name or chosen.wait_s > 0):
        listed = "; ".join(f"{o.name} {o.how}" for o in options)
        if skipped:
            listed += "; not " + "; not ".join(skipped)
        reason = (
            f"{rid}: bound to {chosen.name}, the instance of {first.name} where it should "
            f"start soonest ({listed})"
        )
        out.append(Flag(request_id=rid, backend=chosen.name, reason=reason))
    return core.backends[chosen.name]


def rebind(core: Core, b: Backend, out: list[Decision]) -> None:
    """``b`` has a free slot (a request there ended, or it became ready): the
    best-ranked requests waiting for a sibling whose load has not begun move to
    it, as many as its slots free beyond its own queue take."""
    if b.spec.instances == 1 or b.state is not BackendState.READY:
        return
    spare = b.free_slots() - b.queue.size
    if spare <= 0:
        return
    for o in members(core, b):
        if o is b or o.state in OCCUPYING:
            continue
        while spare > 0 and o.queue.size:
            req = o.queue.head()
            if req is None:
                break
            _move(core, req, o, b)
            spare -= 1
            reason = (
                f"{req.id}: moved from {o.name} ({o.state.value}) to {b.name}, ready with "
                "a free slot"
            )
            out.append(Flag(request_id=req.id, backend=b.name, reason=reason))


def _move(core: Core, req: Req, src: Backend, dst: Backend) -> None:
    """Move queued ``req`` from ``src``'s queue to ``dst``'s, keeping its rank,
    urgency and start-by (its timers follow its new generation)."""
    src.queue.removed(req)
    req.gen += 1  # its entries in src's queue, and its timers, are stale now
    req.backend = dst.name
    dst.queue.push(req)
    if req.urgent_at is not None and not req.urgent:
        core.timers.set(req.urgent_at, Timer.URGENT, req.id, req.gen)
    if req.start_by is not None and not req.deadline_met:
        core.timers.set(req.start_by, Timer.DEADLINE, req.id, req.gen)
    core.touched.add(src.name)
    core.touched.add(dst.name)


def _service_s(core: Core, group: Sequence[Backend]) -> float:
    """The mean service time of the group's instances: the first measured one's
    (same server, same model: an instance that served nothing yet is expected
    to serve as its sibling does), else the default."""
    for b in group:
        if b.service_ewma is not None:
            return b.service_ewma
    return core.config.default_service_s


def _option(
    core: Core, b: Backend, group: Sequence[Backend], service: float, penalty: float, now: float
) -> tuple[Option | None, str]:
    """``b`` as an option (None, and why not, if it may not take the request)."""
    slots = b.free_slots() + len(b.running)
    queued = b.queue.size
    further = b is not group[0]
    if b.state is BackendState.READY:
        left = 0.0
        remaining = [_left(r.dispatched_at, service, now) for r in b.running.values()]
        wait = expected_wait(
            load_left_s=0.0, slots=slots, remaining=remaining, queued=queued, service_s=service
        )
        how = f"ready, {len(b.running)} of {slots} slots busy, {queued} waiting"
    elif b.state is BackendState.STARTING:
        assert b.started_at is not None
        left = max(0.0, b.started_at + core.load_s(b) - now)
        how = f"loading, {reasons.secs(left)} left, {queued} waiting"
        wait = expected_wait(
            load_left_s=left, slots=slots, remaining=(), queued=queued, service_s=service
        )
    elif b.state in OCCUPYING:
        return None, f"({b.state.value})"
    else:
        if further and b.profile is None:
            return None, "(no profile yet: the first instance's first load measures it)"
        if further and not _fits_beside(core, b, group):
            return None, "(does not fit beside the instances loaded)"
        left = core.start_cost(b, now)[0]
        how = f"not loaded, starts in about {reasons.secs(left)}, {queued} waiting"
        wait = expected_wait(
            load_left_s=left, slots=slots, remaining=(), queued=queued, service_s=service
        )
    if wait > left:
        how += f" (about {reasons.secs(wait)} until a slot)"
    loads = b.state not in OCCUPYING
    if loads:
        how += f", counted as {reasons.secs(wait + penalty * left)} for the load"
    load_s = left if loads else 0.0
    return Option(name=b.name, wait_s=wait, how=how, load_s=load_s, penalty=penalty), ""


_OVERRUN_LEFT = 0.1
"""A request running longer than the mean service time is expected to hold its
slot this fraction of it more (never "about to end" forever: a hung request)."""


def _left(dispatched_at: float | None, service: float, now: float) -> float:
    """Seconds a running request should still hold its slot: the mean service
    time less what it has run, at least a tenth of the mean."""
    ran = 0.0 if dispatched_at is None else now - dispatched_at
    return max(service - ran, _OVERRUN_LEFT * service)


def _fits_beside(core: Core, b: Backend, group: Sequence[Backend]) -> bool:
    """Whether some placement of ``b`` fits next to the other instances holding
    memory (and foreign use), whatever else would have to make room."""
    for _gpus, need in core.options(b):
        fits = True
        for device, amount in need.items():
            dev = core.devices.get(device)
            if dev is None:
                fits = False
                break
            held = sum(
                o.held(device)
                for o in group
                if o is not b and o.state in OCCUPYING and device in o.devices
            )
            if amount + held + dev.foreign > dev.spec.usable_bytes:
                fits = False
                break
        if fits:
            return True
    return False


def spread(core: Core, first: Backend, near: Sequence[Window], now: float) -> None:
    """Ready the further instances of ``first`` for the work ahead its ``near``
    windows announce (its best near window stands in for ``first`` already).

    Further instance ``k`` gets a stand-in of its own for the best of those
    windows (same rank: ahead of the window's requests, loaded where memory
    allows without evicting work that ranks higher, kept while they are near)
    when the work they count (an announcement its whole count, a held request
    one) is more than the slots of the instances before it: an announcement of
    3 requests readies ``news@2`` beside a ``news`` of 1 slot, not beside one of
    3. Never for a first load (:func:`awaits_profile`), nor for a window it
    failed to start for (``Window.gave_up_on``); an instance with windows of its
    own keeps to those. Changes are noted in ``core.touched`` for planning.
    """
    boost = core.config.deadline_boost
    before = [first.name]
    slots = first.slots
    for b in members(core, first)[1:]:
        mine = [w for w in near if b.name not in w.gave_up_on]
        work = sum(w.used + w.left if w.kind == "announced" else 1 for w in mine)
        if core.windows.by_backend.get(b.name):
            pass  # its own windows set its stand-in
        elif work > slots and mine and not awaits_profile(b):
            best = min(mine, key=lambda w: order_key(w.stand_in, boost))
            _ready_ahead(core, b, _stand_in(core, best, b))
            announced = sum(w.used + w.left for w in mine if w.kind == "announced")
            held = sum(1 for w in mine if w.kind == "held")
            opens = min(mine, key=lambda w: (w.opens, w.id))
            when = opens.label or reasons.in_s(opens.opens - now)
            beyond = reasons.beyond_slots(before, slots)
            b.ahead_load_why = (
                reasons.loading_ahead(b.name, announced, held, when, best.id) + f", {beyond}"
            )
            keep = reasons.keeping_ahead(b.name, announced, held, when, core.load_s(b))
            keep += f" ({beyond})"
            if keep != b.ahead_keep_why:
                b.ahead_keep_why = keep
                core.touched.add(b.name)  # plans that read it refused to evict it so
        elif b.ahead is not None:
            _ready_ahead(core, b, None)
            b.ahead_load_why = b.ahead_keep_why = ""
        before.append(b.name)
        slots += b.slots


def _stand_in(core: Core, win: Window, b: Backend) -> Req:
    """The stand-in for ``win`` on further instance ``b``: the window's, under
    an id of its own (ranked just after the first instance's)."""
    req = win.spread.get(b.name)
    if req is None:
        req = replace(win.stand_in, id=f"{win.stand_in.id} for {b.name}", backend=b.name)
        win.spread[b.name] = req
    if req.urgent != win.stand_in.urgent:  # the window's urgency (yard.core.windows)
        req.urgent = win.stand_in.urgent
        req.rank = win.stand_in.rank
        core.touched.add(b.name)
    return req


def _ready_ahead(core: Core, b: Backend, ahead: Req | None) -> None:
    """Set ``b``'s stand-in for work ahead (None: none), as
    :mod:`yard.core.windows` does for the first instance."""
    if ahead is b.ahead:
        return
    core.touched.add(b.name)
    if ahead is None and b.state is BackendState.READY and b.idle_since is not None:
        b.idle_since = None  # idle from now: its idle timer starts again
    b.ahead = ahead


def awaits_profile(b: Backend) -> bool:
    """Whether ``b`` is a further instance with no profile yet: it is loaded for
    a request bound to it, but never for a wish to load (pinned, an operator's
    load), which waits for the first instance's first load to measure the
    profile every instance shares."""
    return b.spec.instance_of is not None and b.profile is None


_LOADABLE = ("stopped", "failed")
_UNLOADABLE = ("starting", "ready", "draining")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminTargets:
    """The instances an operator's action on a backend's name acts on.

    backend: the backend the name stands for (``news`` for ``news`` and for
        ``news@1``; ``news@2`` for ``news@2``).
    names: the instances to send the action to, in number order; empty when
        there is nothing to do (``detail`` says why).
    group: the name was a backend with several instances, taken as a whole.
    detail: for a group, what is acted on and why, for people ("" otherwise).
    """

    backend: str
    names: tuple[str, ...]
    group: bool = False
    detail: str = ""


def admin_targets(action: str, name: str, backends: Sequence[BackendView]) -> AdminTargets | None:
    """What ``action`` (``load``, ``unload``, ``pin`` or ``unpin``: an operator's
    ``POST /admin/backends/NAME/ACTION``) on ``name`` acts on, given
    every backend's view now; None when no backend has that name.

    A backend's configured name stands for all its instances, as the model name
    does for apps: ``unload`` acts on every instance loaded or loading but the
    pinned ones (unpin first), ``pin`` and ``unpin`` on every instance
    whose pin changes (as ``pinned = true`` in the file pins each), and ``load``
    loads ONE more instance: the first that is not loaded (a further one only
    once the profile all share is measured: the first load measures it). One
    instance is named ``NAME@K``, the first alone ``NAME@1`` (or ``NAME`` where the
    backend has one instance); the action then goes to it whatever its state,
    and the core says in a ``Flag`` if it does nothing.
    """
    views = {v.name: v for v in backends}
    first, _, number = name.partition(INSTANCE_SEPARATOR)
    group = sorted(
        (v for v in backends if first_instance(v.name) == first),
        key=lambda v: instance_number(v.name, first) or 0,
    )
    if number == "1" and len(group) > 1:
        return AdminTargets(backend=first, names=(first,))
    if name not in views:
        return None
    if number or len(group) == 1:
        return AdminTargets(backend=name, names=(name,))
    everyone = ", ".join(v.name for v in group)
    chosen: list[BackendView]
    if action == "load":
        stopped = [v for v in group if v.state in _LOADABLE]
        loadable = [v for v in stopped if v is group[0] or v.profile is not None]
        chosen = loadable[:1]
        if chosen:
            detail = f"loading {chosen[0].name}, the first instance of {first} not loaded"
        elif stopped:
            detail = (
                f"{stopped[0].name} waits for the first load of {first}, which measures the "
                "profile every instance shares"
            )
        else:
            detail = f"every instance of {first} ({everyone}) is loaded or loading"
    elif action == "unload":
        loaded = [v for v in group if v.state in _UNLOADABLE]
        chosen = [v for v in loaded if not v.pinned]
        if chosen:
            detail = f"unloading every instance of {first} loaded or loading"
        elif loaded:
            detail = f"every instance of {first} loaded is pinned; unpin {first} first"
        else:
            detail = f"no instance of {first} ({everyone}) is loaded or loading"
        pinned = [v.name for v in loaded if v.pinned]
        if chosen and pinned:
            detail += f", except the pinned {', '.join(pinned)}"
    else:
        pin = action == "pin"
        chosen = [v for v in group if v.pinned is not pin]
        word = "pinning" if pin else "unpinning"
        if chosen:
            detail = f"{word} every instance of {first}"
        else:
            detail = f"every instance of {first} ({everyone}) is {action}ned already"
    names = tuple(v.name for v in chosen)
    if names:
        detail += f": {', '.join(names)}"
    return AdminTargets(backend=first, names=names, group=True, detail=detail)


def share_profile(core: Core, b: Backend) -> None:
    """``b``'s profile changed (measured, raised, forgotten): it is every other
    instance's profile too; those holding memory reserve by it."""
    for o in members(core, b):
        if o is b:
            continue
        o.profile = b.profile
        o.profile_has_load = b.profile_has_load
        core.forget_fit(o)
        core.touched.add(o.name)
        if o.profile is not None and o.state in OCCUPYING and o.devices:
            o.reserved = core.need_running(o)
            o.measuring = False
            core.touched_devices.update(o.devices)
