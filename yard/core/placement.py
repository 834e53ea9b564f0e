"""Placement: where a backend may load, and what must make room for it.

Pure functions of explicit inputs: the records of the devices and backends (read,
never changed), what this planning round has already promised (memory booked,
devices claimed, victims taken) and the settings. The scheduler carries out the
plan they return.

Rules
-----

- A backend starts only where its reservation (profile x ``profile_margin``)
  fits on every device it gets (its GPUs and ``host``) next to the
  reservations (or live use, if higher) of every loaded, loading and stopping
  backend, the foreign use seen by the meter and the device's reserve. One
  load at a time per device: its GPUs, or ``host`` for a host-only backend
  (every backend holds some host memory, so counting ``host`` for all would
  serialise every load on the machine). A backend with no profile is measured
  during its first load, placed by the prior from its model file
  (``BackendSpec.prior``) as by a profile: next to others only where that
  estimate fits what is free (foreign memory included), else room is made.
  It loads alone where the meter cannot tell its memory apart
  (``DeviceSpec.per_process`` false), and nothing loads next to it there
  until its profile arrives; elsewhere alone only when the step-down after
  starts that ran out of memory says so (:func:`yard.core.failures.step`).
  Exclusive devices hold one backend at a time.
- Among several GPUs it may use, a backend goes where it needs no eviction,
  else where evicting costs least (no busy one if possible, then the least
  total reload time), then where the most memory is left, then by device name.
- Room is made by stopping idle, unpinned backends whose waiting requests do
  not rank above the request that needs the room, and that are no other
  instance of the backend being loaded (:mod:`yard.core.victims`), no more
  than needed. The
  least needed and cheapest to reload go first: those nobody waits for, then
  the least expected reload time per GiB freed: its recent arrival rate
  (arrivals decayed over ten minutes) times its reload seconds per GiB held
  (:func:`yard.core.victims.demand`), so that a backend in use every few
  seconds goes after one idle for twenty minutes, however cheap it is to
  reload. (GreedyDual-Size alone, below, ranked by reload cost per GiB
  wherever evictions are an hour apart: chat, in use every second, went
  before news-llm idle since the last news.) A backend that may load on
  another GPU too goes first among them, by GreedyDual-Size credit (Cao &
  Irani, 1997) alone: on each use it gets ``L + load_s / GiB held``, where
  ``L`` is the credit of the last one evicted; its eviction may be a move
  that evicts nothing where it goes. (Ranking by load time alone kept
  evicting the popular small model: twice the loads in the sim's
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
  start: each start-by less the swap's load time and the services its slots
  give the start-bys before it (:func:`yard.core.estimates.swap_latest_start`;
  with more start-bys than slots on a swap that never served a request, no
  overtake).
- A load for an urgent window ahead (:mod:`yard.core.windows`) whose time has
  not come (:func:`load_due`) drains its busy victims and *holds* its idle ones
  (drained: loaded, no new work) until it is due, when they stop and it starts;
  one let load early (its victims idle until the window) is due at once.
  Until then a victim with waiting work still takes the requests expected to
  end by the time the load is due (its mean service time, :func:`ends_before`):
  only work that would run into the load waits for the window.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence

from yard.core import estimates, failures, reasons, resources
from yard.core.lifecycle import OCCUPYING, BackendState
from yard.core.plans import NoRoom, Outcome, Plan, Reads, Room
from yard.core.queue import Req
from yard.core.records import Backend, Device
from yard.core.spec import HOST, DeviceSpec, SchedulerConfig
from yard.core.victims import evict_key, refusal


def loading(device: str) -> str:
    """The key under which :class:`Reads` notes that a plan asked whether a
    load runs on ``device``."""
    return "load:" + device


def loads_alone(b: Backend, device: DeviceSpec) -> bool:
    """Whether ``b``'s next load must be alone on ``device`` to be measured: it
    has no profile, and the meter cannot tell its memory from its neighbours'
    there (device deltas) or its loads next to them ran out of memory
    (:func:`yard.core.failures.step`)."""
    if b.profile is not None:
        return False
    return not device.per_process or failures.step(b).alone


def survey(devices: Iterable[str], backends: Iterable[Backend]) -> Room:
    """Who holds what, now."""
    occupants: dict[str, list[Backend]] = {d: [] for d in devices}
    used = dict.fromkeys(occupants, 0)
    freeing = dict.fromkeys(occupants, 0)
    loading: dict[str, Backend] = {}
    held_by: dict[str, dict[str, int]] = {}
    heads: dict[str, Req | None] = {}
    occupying: list[Backend] = []
    for b in backends:
        state = b.state
        if state not in OCCUPYING:
            continue
        heads[b.name] = b.head()
        occupying.append(b)
        held: dict[str, int] = {}
        reserved, live = b.reserved, b.live
        for d in b.devices:
            x = held[d] = max(reserved.get(d, 0), live.get(d, 0))  # Backend.held, inline
            occupants[d].append(b)
            used[d] += x
            if state is BackendState.STOPPING:
                freeing[d] += x
            elif state is BackendState.STARTING and d not in loading:
                loading[d] = b
        held_by[b.name] = held
    if len(occupying) > 1:
        occupying.sort(key=evict_key)
    return Room(occupants, used, freeing, loading, held_by, heads, occupying)


def gpu_sets(b: Backend, devices: Mapping[str, Device]) -> list[tuple[str, ...]]:
    """Every set of GPUs one instance of ``b`` may take (``[()]`` host-only,
    ``[]`` if this machine lacks enough of its GPUs)."""
    if not b.spec.gpus:
        return [()]
    gpus = sorted(g for g in b.spec.gpus if g in devices)
    if len(gpus) < b.spec.gpu_count:
        return []
    return list(itertools.combinations(gpus, b.spec.gpu_count))


def fits_empty(
    b: Backend,
    options: Sequence[tuple[tuple[str, ...], Mapping[str, int]]],
    devices: Mapping[str, Device],
    margin: float = 1.0,
) -> tuple[bool, str]:
    """Whether ``b`` fits on an empty machine in one of its ``options`` (GPU set,
    need per device); if not, why."""
    if not options:
        present = [g for g in devices if g != HOST]
        return False, reasons.no_gpus(b.name, b.spec.gpu_count, b.spec.gpus, present)
    if b.estimate is None:
        return True, ""
    # A prior is an estimate: it refuses at once only where its figure itself,
    # without the margin reservations carry, exceeds the device.
    prior = b.spec.prior if b.profile is None else None
    worst: list[tuple[str, int, int]] = []
    for _gpus, need in options:
        short = [
            (d, n, devices[d].spec.usable_bytes)
            for d, n in need.items()
            if (n / margin if prior is not None else n) > devices[d].spec.usable_bytes
        ]
        if not short:
            return True, ""
        worst = worst or short
    if prior is not None:
        return False, reasons.too_big_estimated(b.name, worst, prior.source)
    return False, reasons.too_big(b.name, worst)


def best_plan(
    b: Backend,
    head: Req | None,
    options: Sequence[tuple[tuple[str, ...], Mapping[str, int]]],
    booked: Mapping[str, int],
    claimed: set[str],
    taken: set[str],
    room: Room,
    devices: Mapping[str, Device],
    config: SchedulerConfig,
    now: float,
    reads: Reads | None = None,
) -> Plan | None:
    """The best of the plans for each of ``options`` (None: there are none).

    ``reads``, if given, collects what the choice rests on (see :class:`Reads`):
    a plan that waits (a load runs there, memory is being freed) wins over any
    eviction whatever the victims' usage, so then only its own reads count;
    otherwise every option's do, since one may overtake another.
    """
    best: Plan | None = None
    best_reads: Reads | None = None
    every: list[Reads] = []
    plans: list[Plan] = []
    for gpus, need in options:
        mine = Reads()
        plan = plan_on(
            b, head, gpus, need, booked, claimed, taken, room, devices, config, now, mine
        )
        every.append(mine)
        plans.append(plan)
        if best is None or plan.key() < best.key():
            best, best_reads = plan, mine
    if reads is not None and best is not None and best_reads is not None:
        if best.status == Outcome.EVICT:
            reads.plans = plans
        for r in [best_reads] if best.status == Outcome.WAIT else every:
            reads.refusals.extend(r.refusals)
            reads.orders.extend(r.orders)
            reads.evicts = reads.evicts or r.evicts
            reads.victims.update(r.victims)
            reads.until = min(reads.until, r.until)
        for r in every:  # memory freed anywhere may let an option start
            reads.devices.update(r.devices)
    return best


def blocked_at_once(
    b: Backend,
    options: Sequence[tuple[tuple[str, ...], Mapping[str, int]]],
    claimed: set[str],
    room: Room,
    reads: Reads,
) -> Plan | None:
    """The plan :func:`best_plan` would return when every option stops at its
    first check (a device claimed this round, or another load running there),
    without working out the rest; None if some option goes further. ``reads``
    collects the devices where it asked whether a load runs."""
    # the first option stopped by a claim, unless one waits for a load
    best: tuple[tuple[str, ...], str, Mapping[str, int], Backend | None] | None = None
    for gpus, need in options:
        for d in gpus or (HOST,):
            if d in claimed:
                if best is None:
                    best = (gpus, d, need, None)
                break
            reads.devices.add(loading(d))
            loader = room.loading.get(d)
            if loader is not None and loader is not b:
                if best is None or best[3] is None:
                    best = (gpus, d, need, loader)
                break
        else:
            return None
    if best is None:
        return None
    gpus, d, need, loader = best
    if loader is None:
        return _claimed(b, gpus, d, need)
    text = reasons.one_load_at_a_time(d, loader.name)
    plan = Plan(b, gpus, Outcome.WAIT, text, need=need)
    plan.retell = lambda _name: text
    return plan


def _claimed(b: Backend, gpus: tuple[str, ...], device: str, need: Mapping[str, int]) -> Plan:
    text = reasons.claimed(device)
    plan = Plan(b, gpus, Outcome.BLOCKED, text, need=need)
    plan.retell = lambda _name: text
    return plan


def plan_on(
    b: Backend,
    head: Req | None,
    gpus: tuple[str, ...],
    need: Mapping[str, int],
    booked: Mapping[str, int],
    claimed: set[str],
    taken: set[str],
    room: Room,
    devices: Mapping[str, Device],
    config: SchedulerConfig,
    now: float,
    reads: Reads | None = None,
    quiet: bool = False,
) -> Plan:
    """The plan to load ``b`` on ``gpus`` for ``head`` (its best waiting request,
    None for a pinned or asked-for load), needing ``need`` per device, after what
    this round already ``booked`` (bytes), ``claimed`` (devices) and ``taken``
    (victims). ``quiet``: only its :meth:`~Plan.key` and ``free_wait_s`` count
    (no reasons, no context chosen)."""
    primary = gpus or (HOST,)
    devs = (*gpus, HOST)
    if reads is None:
        reads = Reads()
    for d in primary:
        if d in claimed:
            return _claimed(b, gpus, d, need)
        reads.devices.add(loading(d))
        loader = room.loading.get(d)
        if loader is not None and loader is not b:
            return Plan(
                b, gpus, Outcome.WAIT, reasons.one_load_at_a_time(d, loader.name), need=need
            )
    reads.devices.update(devs)
    where = "+".join(primary)
    # Who must go: on exclusive devices everybody; for a first load the meter
    # cannot tell apart, everybody on its devices; next to a backend being
    # measured that way, that backend.
    required: list[Backend] = []
    for d in primary:
        spec = devices[d].spec
        alone = spec.exclusive or loads_alone(b, spec)
        for o in room.occupants[d]:
            measured_by_delta = o.measuring and not spec.per_process
            if o is not b and (alone or measured_by_delta) and o not in required:
                required.append(o)
    free_now: dict[str, int] = {}
    eventual: dict[str, int] = {}
    deficit: dict[str, int] = {}
    for d in devs:
        dev = devices[d]
        free_now[d] = dev.spec.usable_bytes - dev.foreign - room.used[d] - booked.get(d, 0)
        eventual[d] = free_now[d] + room.freeing[d]
        deficit[d] = need[d] - eventual[d]
    boost = config.deadline_boost
    order: list[Backend] = []
    reads.orders.append(order)

    def eligible(o: Backend) -> str | None:
        why_not = refusal(o, room.heads[o.name], b, head, taken, boost)
        reads.refusals.append((o, why_not))
        return why_not

    def free(o: Backend, sign: int) -> None:
        held = room.held[o.name]
        for d in devs:
            x = held.get(d)
            if x:
                deficit[d] -= sign * x

    chosen: list[Backend] = []
    still_stopping = False
    for o in required:
        if o.state is BackendState.STOPPING:
            still_stopping = True
            continue
        why_not = eligible(o)
        if why_not is not None:
            plan = Plan(b, gpus, Outcome.BLOCKED, "", need=need)
            if quiet:
                return plan
            plan.retell = lambda name, why=why_not: reasons.must_load_alone(where, name, why)
            plan.reason = plan.retell(b.name)
            return plan
        chosen.append(o)
        free(o, 1)
    if any(x > 0 for x in deficit.values()):
        blockers: list[str] = []
        greedy: list[Backend] = []
        # Which of them it reaches, and in which order, counts: every backend
        # holding memory where memory is short, including those after the ones
        # it stops at (deficits only shrink as it goes: nobody else is reached).
        tight = [d for d in devs if deficit[d] > 0]
        order.extend(
            o
            for o in room.evict_order
            if o is not b and o not in chosen and any(room.held[o.name].get(d) for d in tight)
        )
        for o in room.evict_order:
            if o is b or o in chosen:
                continue
            held = room.held[o.name]
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
            if quiet:
                return Plan(b, gpus, Outcome.BLOCKED, "", need=need)
            short = max(devs, key=lambda d: deficit[d])
            at, needs, free_there = short, need[short], eventual[short]
            plan = Plan(b, gpus, Outcome.BLOCKED, "", need=need)
            plan.retell = NoRoom(at, needs, free_there, tuple(blockers))
            plan.reason = plan.retell(b.name)
            return plan
        # stop no more than needed: drop greedy picks that turned out spare
        for o in reversed(list(greedy)):
            held = room.held[o.name]
            if all(deficit[d] + held.get(d, 0) <= 0 for d in devs):
                greedy.remove(o)
                free(o, -1)
        chosen.extend(greedy)
    slack = min(-deficit[d] for d in devs)
    if not chosen:
        if quiet:  # it starts or waits for memory being freed: no victims
            ok = not still_stopping and all(need[d] <= free_now[d] for d in devs)
            return Plan(b, gpus, Outcome.START if ok else Outcome.WAIT, "", need=need, slack=slack)
        if not still_stopping and all(need[d] <= free_now[d] for d in devs):
            prior = b.spec.prior if b.profile is None else None
            choice = resources.choose(
                b.spec,
                b.estimate,
                gpus,
                config.profile_margin,
                free_now,
                estimated=prior.source if prior is not None else None,
                minimum=failures.step(b).minimum,
            )
            if choice is not None:
                need = choice.need
            figures = [(d, need[d], free_now[d]) for d in devs]
            text = reasons.placed(where, figures, b.estimate is not None)
            plan = Plan(b, gpus, Outcome.START, text, need=need, slack=slack)
            if choice is not None:
                plan.reason += "; " + choice.why
                plan.context, plan.parallel = choice.context, choice.parallel
            elif prior is not None:
                p = prior.profile
                nbytes = p.gpu_bytes if gpus else p.host_bytes
                plan.reason += "; " + reasons.estimated(prior.source, nbytes, None, primary[0])
            return plan
        stopping = [
            o.name
            for o in room.evict_order
            if o.state is BackendState.STOPPING and any(d in o.devices for d in devs)
        ]
        order.extend(o for o in room.evict_order if o.name in stopping)
        text = reasons.wait_for_stopping(stopping, where)
        return Plan(b, gpus, Outcome.WAIT, text, need=need, slack=slack)
    reads.evicts = True
    reads.victims.update(o.name for o in chosen)
    plan = _evict(
        b, head, gpus, need, chosen, slack, free_now, devices, config, now, reads, quiet=quiet
    )
    plan.made_room = (chosen, free_now)
    return plan


def evict_again(
    plan: Plan,
    head: Req | None,
    devices: Mapping[str, Device],
    config: SchedulerConfig,
    now: float,
    reads: Reads | None = None,
) -> Plan:
    """The evicting ``plan`` worked out again for ``head`` at ``now`` from the
    victims it chose and the memory it saw (:func:`plan_on`'s last step): what
    planning afresh gives when nothing it read changed but the clock and the
    head's overtakes (its reasons tell them; the choice of option does not read
    them while the head may still be overtaken), or but what it reads of its
    victims to decide how each makes room. ``reads`` collects its ``until``."""
    assert plan.made_room is not None
    chosen, free_now = plan.made_room
    b, gpus, need = plan.backend, plan.gpus, plan.need
    # the room it reads (need and free memory where it is shortest) is as it was
    again = _evict(
        b, head, gpus, need, chosen, plan.slack, free_now, devices, config, now, reads, plan.room
    )
    again.made_room = plan.made_room
    return again


def evict_options_again(
    plans: list[Plan],
    head: Req | None,
    devices: Mapping[str, Device],
    config: SchedulerConfig,
    now: float,
) -> tuple[Plan, list[Plan], float] | None:
    """:func:`best_plan` worked out again from the plans of its options
    (``Reads.plans`` of an evicting best plan) where nothing they read changed
    but how their victims make room (:func:`evict_again` of each that evicts;
    the blocked ones stand): the best, every option's plan, and the latest
    time its batching holds. None where an option neither evicts nor is blocked."""
    best: Plan | None = None
    again: list[Plan] = []
    until = math.inf
    for plan in plans:
        if plan.status == Outcome.EVICT:
            mine = Reads()
            plan = evict_again(plan, head, devices, config, now, mine)
            until = min(until, mine.until)
        elif plan.status != Outcome.BLOCKED:
            return None
        again.append(plan)
        if best is None or plan.key() < best.key():
            best = plan
    return None if best is None else (best, again, until)


def load_due(b: Backend, head: Req | None, config: SchedulerConfig) -> float | None:
    """When ``b``'s load for ``head`` must start, where ``head`` is the urgent
    stand-in for an announced window (``opens - load_s - lead_margin_s``, as a
    window that is near but not urgent loads) and no request waits for ``b``
    (one that does needs the load now, ranked below the stand-in or not), nor
    was it let load early (:mod:`yard.core.windows`); None for any other load."""
    if head is None or head is not b.ahead or not head.urgent or head.early or b.queue.size:
        return None
    return head.arrived_at - estimates.load_s(b, config) - config.lead_margin_s


def ends_before(o: Backend, due: float, now: float, config: SchedulerConfig) -> bool:
    """Whether a request for ``o`` dispatched ``now`` is expected to end (``o``'s
    mean service time) by ``due``, the time a load it makes room for is due."""
    return now + estimates.service_est(o, config) <= due


def _evict(
    b: Backend,
    head: Req | None,
    gpus: tuple[str, ...],
    need: Mapping[str, int],
    chosen: list[Backend],
    slack: int,
    free_now: dict[str, int],
    devices: Mapping[str, Device],
    config: SchedulerConfig,
    now: float,
    reads: Reads | None,
    room: str = "",
    *,
    quiet: bool = False,
) -> Plan:
    """The plan that makes room by stopping, draining or (batching) first serving
    the ``chosen`` victims (``room``: its sentence of the room it needs, if known;
    ``quiet``: without the sentences, see :func:`plan_on`)."""
    plan = Plan(b, gpus, Outcome.EVICT, "", need=need, slack=slack)
    parts: list[str] = []
    batched: list[tuple[int, str]] = []  # parts that tell the overtakes left
    until = math.inf  # the latest time its batching (and early work) holds
    due = load_due(b, head, config)
    if due is not None and now < due:
        # Urgent for work ahead, its load not yet due: the busy victims drain
        # now, the idle ones are held (no new work) until the load is due.
        plan.hold_until = due
        until = min(until, due)
    may_batch = head is not None and not head.urgent and head.overtakes < config.batch_bound
    # the swap's latest start, asked once (overtake_denied and overtake_until ask it per victim)
    latest = estimates.swap_latest_start(b, config) if may_batch else None
    for o in chosen:
        plan.cost += estimates.load_s(o, config)
        # A backend loaded for waiting requests serves one of them before it
        # goes (else its load was wasted). Batching beyond that is worth it only
        # while the swap's head can wait: an urgent deadline gets the swap at once.
        fresh = o.state is BackendState.READY and o.dispatched_since_ready == 0
        batching = may_batch
        if batching and latest is not None:
            # estimates.overtake_denied is None, and then overtake_until
            hi = estimates.service_hi(o, config)
            batching = now + hi <= latest
            if batching:
                until = min(until, latest - hi)
        # Until an urgent window's load is due, its victims still take the
        # work expected to end by then (their mean service): only what would
        # run into the load waits for the window.
        early = False
        if plan.hold_until is not None and o.queue.size > 0:
            early = ends_before(o, plan.hold_until, now, config)
            if early:
                early_until = plan.hold_until - estimates.service_est(o, config)
                until = min(until, early_until)
        if o.queue.size > 0 and (fresh or batching or early):
            plan.pending.append(o)
            if batching and head is not None:
                batched.append((len(parts), o.name))
                parts.append(reasons.serves_more_first(o.name, config.batch_bound - head.overtakes))
            elif fresh or plan.hold_until is None:
                parts.append(reasons.serves_first_since_loading(o.name))
            else:
                parts.append(reasons.serves_before_due(o.name, plan.hold_until - now))
            plan.free_wait_s = max(plan.free_wait_s, estimates.service_est(o, config))
        elif o.busy():
            plan.drain.append(o)
            parts.append(reasons.busy_must_finish(o.name))
            plan.free_wait_s = max(plan.free_wait_s, estimates.service_est(o, config))
        elif plan.hold_until is not None:
            plan.drain.append(o)
            parts.append(reasons.holding_idle(o.name, plan.hold_until - now))
            plan.free_wait_s = max(plan.free_wait_s, plan.hold_until - now)
        else:
            plan.stop.append(o)
            parts.append(reasons.stopping_idle(o.name, estimates.load_s(o, config), o.places > 1))
    if quiet:
        return plan
    if not room:
        devs = (*gpus, HOST)
        short = max(devs, key=lambda d: (need[d] - free_now[d], d))
        if any(loads_alone(b, devices[d].spec) for d in gpus or (HOST,)):
            room = reasons.room_unmeasured(short, b.name)
        else:
            room = reasons.room_short(short, b.name, need[short], free_now[short])
    plan.room = room
    plan.reason = reasons.evicting(plan.room, parts)
    plan.parts = (parts, batched)
    if reads is not None:
        reads.until = min(reads.until, until)
    return plan
