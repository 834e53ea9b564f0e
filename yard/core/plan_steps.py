"""A planning round's records, and whether what a plan read still holds.

:mod:`yard.core.planning` keeps one :class:`Step` per backend waiting for a
load: the plan it got, after which :class:`Frontier` (what the plans before it
booked, claimed and took) and what it read (:class:`~yard.core.plans.Reads`).
The functions here answer the questions a round asks before it reuses a step
instead of planning it afresh: does another frontier answer what the plan asked
the same way (:func:`reads_same`), did a backend it read change in what it read
(:func:`read_sig`, :func:`still_reads`, :func:`victim_sig`,
:func:`evicting_changed`), did its own head move (:func:`head_moved`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from yard.core import estimates
from yard.core.instances import awaits_profile
from yard.core.lifecycle import LOADED, BackendState
from yard.core.plans import Outcome, Plan, Reads
from yard.core.queue import Req, order_key
from yard.core.records import Backend
from yard.core.spec import HOST, SchedulerConfig
from yard.core.victims import evict_key, family_of, refusal_by_key

Key = tuple[float, float, str]
"""A request's :func:`~yard.core.queue.order_key` (as :data:`yard.core.victims.Key`)."""

_WAITING_FOR_LOAD = (BackendState.STOPPED, BackendState.FAILED, BackendState.STOPPING)

CLOCK_MARGIN_S = 1e-3
"""Batching is planned again this long before the clock could end it (the
comparison in :func:`~yard.core.estimates.overtake_denied` rounds differently)."""


@dataclass(slots=True, eq=False)
class Frontier:
    """What the backends planned so far in a round booked, claimed and took."""

    booked: dict[str, int] = field(default_factory=dict)
    claimed: set[str] = field(default_factory=set)
    taken: set[str] = field(default_factory=set)

    def copy(self) -> Frontier:
        return Frontier(dict(self.booked), set(self.claimed), set(self.taken))

    def same(self, other: Frontier) -> bool:
        return (
            self.booked == other.booked
            and self.claimed == other.claimed
            and self.taken == other.taken
        )


@dataclass(slots=True, eq=False)
class Step:
    """One backend's place in a round and what its plan was."""

    backend: Backend
    state: BackendState
    head: Req | None
    urgent: bool
    overtakes: int
    plan: Plan | None  # None: it is still stopping, or has no place on this machine
    reads: Reads
    names: frozenset[str]  # the backends in reads
    claims: frozenset[str]  # the devices whose claim it may have read
    books: frozenset[str]  # the devices whose booking it may have read
    before: Frontier  # the frontier it was planned after
    after: Frontier | None  # the frontier after it, if its plan changed it
    head_key: tuple[float, float, str] | None = None  # order_key of head
    why: dict[str, str | None] = field(default_factory=dict)  # reads.refusals by name
    ordered: frozenset[str] = frozenset()  # the backends in reads.orders of two or more
    # evicting: what it read of each victim when it chose them (:func:`victim_sig`),
    # and its latest start for the start-bys waiting for it (batching holds by it)
    victims: dict[str, VictimSig] | None = None
    latest_start: float | None = None


EMPTY = Frontier()
"""The frontier before the first plan of a round (never changed: plans copy it)."""


@dataclass(slots=True, eq=False)
class Told:
    """A plan worked out in this round, with what it read, by name."""

    plan: Plan | None
    reads: Reads
    names: frozenset[str]
    why: dict[str, str | None]  # reads.refusals by name
    ordered: frozenset[str]  # the backends in reads.orders of two or more
    head_key: tuple[float, float, str] | None  # order_key of the head it was planned for
    at_once: bool = False  # it stopped at its first checks (it read no booking, no victim)


def ranks_no_higher(key: Key | None, than: Key | None) -> bool:
    """Whether a request ranked ``key`` is refused by every backend that refused
    one ranked ``than`` (None: no request; refused by every backend with one)."""
    if key is None or than is None:
        return key is than
    return than <= key


def frontier_after(plan: Plan, frontier: Frontier) -> Frontier:
    """The frontier after ``plan`` (one that starts, waits or evicts): its
    devices claimed; waiting or evicting, it holds its place: what it needs is
    booked and its victims taken, so that nothing ranked lower is placed there
    first."""
    claimed = set(frontier.claimed)
    claimed.update(plan.gpus or (HOST,))
    if plan.status is Outcome.START:
        return Frontier(dict(frontier.booked), claimed, set(frontier.taken))
    taken = set(frontier.taken)
    for victims in (plan.stop, plan.drain, plan.pending):
        for v in victims:
            taken.add(v.name)
    booked = dict(frontier.booked)
    for d, n in plan.need.items():
        booked[d] = booked.get(d, 0) + n
    return Frontier(booked, claimed, taken)


def reads_same(step: Step, frontier: Frontier) -> bool:
    """Whether ``frontier`` answers what ``step``'s plan asked of the one it was
    planned after the same way: whether its devices are claimed, how much is
    booked there, whether the backends it considered as victims are taken."""
    before = step.before
    for d in step.claims:
        if (d in frontier.claimed) != (d in before.claimed):
            return False
    for d in step.books:
        if frontier.booked.get(d, 0) != before.booked.get(d, 0):
            return False
    return all((name in frontier.taken) == (name in before.taken) for name in step.names)


def quiet_from(steps: list[Step], frontier: Frontier) -> int:
    """The first index of ``steps`` from which every step changes no frontier
    (none books, claims or takes), was planned after the same frontier as the
    last one, and finds ``frontier`` answer what it asked the same way
    (:func:`reads_same` of each, asked at once: what each read against what
    differs between the two frontiers); ``len(steps)`` where the last does not."""
    j = len(steps)
    if not j:
        return j
    before = steps[-1].before
    claimed = frontier.claimed ^ before.claimed
    taken = frontier.taken ^ before.taken
    booked = {
        d
        for d in frontier.booked.keys() | before.booked.keys()
        if frontier.booked.get(d, 0) != before.booked.get(d, 0)
    }
    while j:
        st = steps[j - 1]
        if (
            st.after is not None
            or st.before is not before
            or (claimed and not st.claims.isdisjoint(claimed))
            or (taken and not st.names.isdisjoint(taken))
            or (booked and not st.books.isdisjoint(booked))
        ):
            break
        j -= 1
    return j


def common_tail(a: list[Backend], b: list[Backend]) -> int:
    """How many backends ``a`` and ``b`` end with alike."""
    n = min(len(a), len(b))
    if a[len(a) - n :] == b[len(b) - n :]:  # the usual case, compared at once
        return n
    n = 0
    for x, y in zip(reversed(a), reversed(b), strict=False):
        if x is not y:
            break
        n += 1
    return n


def reuse_after(step: Step, frontier: Frontier) -> None:
    """Reuse ``step``'s plan after ``frontier`` (see :func:`reads_same`)."""
    step.before = frontier
    if step.after is not None and step.plan is not None:
        step.after = frontier_after(step.plan, frontier)


Sig = tuple[bool, BackendState, tuple[float, float, str] | None, bool, str, tuple[object, ...]]


def read_sig(o: Backend, boost: float) -> Sig:
    """Everything a plan may read of ``o`` besides the frontier: what
    :func:`~yard.core.victims.refusal` asks of it and its
    :func:`~yard.core.victims.evict_key` (its place in the eviction order)."""
    head = o.head()
    key = None if head is None else order_key(head, boost)
    ahead = head is not None and head is o.ahead
    return (o.pinned, o.state, key, ahead, o.ahead_keep_why, evict_key(o))


def only_key(old: Sig, new: Sig) -> bool:
    """Whether of two :func:`read_sig` only the order key of the best waiting
    request differs (its eviction key aside)."""
    return old[0] == new[0] and old[1] is new[1] and old[3] == new[3] and old[4] == new[4]


def still_reads(
    step: Step,
    o: Backend,
    o_head: Req | None,
    o_key: tuple[float, float, str] | None,
    refused: bool,
    ordered: bool,
) -> bool:
    """Whether what ``step``'s plan read of backend ``o`` (whose best waiting
    request is ``o_head``, ranked by ``o_key``) is still so: why it refused to
    evict ``o`` (if ``refused``: that may have changed) and the eviction order
    of the options that went through ``o`` (if ``ordered``)."""
    name = o.name
    if refused and name in step.why:
        taken = step.before.taken
        family = family_of(step.backend, step.head)
        why = refusal_by_key(o, o_head, o_key, step.head_key, taken, family)
        if why != step.why[name]:
            return False
    if ordered and name in step.ordered:
        for order in step.reads.orders:
            if len(order) > 1 and o in order and sorted(order, key=evict_key) != order:
                return False
    return True


VictimSig = tuple[bool, bool, bool, bool | None, float, float | None]


def victim_sig(
    o: Backend, b: Backend, head: Req | None, now: float, config: SchedulerConfig
) -> VictimSig:
    """What an evicting plan for ``b`` (for ``head``) reads of its victim ``o``
    when it decides how ``o`` makes room (:func:`~yard.core.placement._evict`):
    whether it is still loaded (ready or draining alike), fresh (ready, nothing
    dispatched since), serves first (it is waited for, and fresh or batching),
    else whether it is busy (drained or stopped), its reload time, and its high
    service estimate where batching asks whether a request for it ends before
    the swap must start (the clock's part is ``Reads.until``). The rest is
    read apart: its refusal and eviction order (:func:`still_reads`), its
    memory and whether it stops (the devices). The plan's ``free_wait_s`` (a
    mean service time) is not in it: only fresh plans' is read
    (:meth:`~yard.core.state.Core.start_cost`)."""
    return _victim_sig(o, _batch_latest(b, head, config), now, config)


_NO_BATCH = math.nan
""":func:`_batch_latest` where the swap's head may not be overtaken."""


def _batch_latest(b: Backend, head: Req | None, config: SchedulerConfig) -> float | None:
    """The swap's latest start as a victim's batching reads it: None where it
    has no start-by (a victim may batch), :data:`_NO_BATCH` where its head may
    not be overtaken (urgent, or its overtakes used up)."""
    if head is not None and not head.urgent and head.overtakes < config.batch_bound:
        return estimates.swap_latest_start(b, config)
    return _NO_BATCH


def _victim_sig(o: Backend, latest: float | None, now: float, config: SchedulerConfig) -> VictimSig:
    """:func:`victim_sig` with its swap's :func:`_batch_latest` asked once for all victims."""
    hi = None
    if latest is None:
        batching = True
    elif latest != latest:  # _NO_BATCH
        batching = False
    else:
        # the test of estimates.overtake_denied, without its sentence
        hi = estimates.service_hi(o, config)
        batching = now + hi <= latest
    fresh = o.state is BackendState.READY and o.dispatched_since_ready == 0
    first = o.queue.size > 0 and (fresh or batching)
    busy = None if first else o.busy()
    return (o.state in LOADED, fresh, first, busy, estimates.load_s(o, config), hi)


def victim_sigs(
    names: Iterable[str],
    backends: dict[str, Backend],
    b: Backend,
    head: Req | None,
    now: float,
    config: SchedulerConfig,
) -> dict[str, VictimSig]:
    """:func:`victim_sig` of each of ``names``, victims of ``b``'s plan for ``head``."""
    latest = _batch_latest(b, head, config)
    return {name: _victim_sig(backends[name], latest, now, config) for name in names}


STANDS = 0
"""An evicting step whose plan still holds (:func:`evicting_changed`)."""
PLAN_AGAIN = 1
"""An evicting step to plan afresh (:func:`evicting_changed`)."""
VICTIMS_AGAIN = 2
"""An evicting step to work out again from its victims (:func:`evicting_changed`)."""


def evicting_changed(
    st: Step, touched: set[str], backends: dict[str, Backend], now: float, config: SchedulerConfig
) -> int:
    """What the evicting ``st`` needs after the backends ``touched`` changed:
    :data:`PLAN_AGAIN` whatever its victims where the clock has run out its
    batching, it holds idle victims until its load is due (its reason counts
    down), its head or its latest start changed
    (:func:`~yard.core.estimates.swap_latest_start`), or it took no account of
    its victims (it stops one) and one is touched; else :data:`VICTIMS_AGAIN`
    where a touched victim changed in what its plan read of it
    (:func:`victim_sig`); else :data:`STANDS`. Its head's overtakes alone are
    not asked here (:func:`head_moved`). The swap's latest start is asked once
    for both."""
    swap = st.backend
    if now >= st.reads.until - CLOCK_MARGIN_S:
        return PLAN_AGAIN
    if st.plan is not None and st.plan.hold_until is not None:
        # Its reason counts down to the load ("stopped when the load is due,
        # in 7.9 s"): a reused plan would tell an old countdown.
        return PLAN_AGAIN
    asked = False
    start: float | None = None
    if swap.name in touched:
        if head_moved(swap, st):
            return PLAN_AGAIN
        start = estimates.swap_latest_start(swap, config)
        asked = True
        if start != st.latest_start or (st.urgent and st.head is swap.ahead):
            return PLAN_AGAIN  # (an urgent hold reads the queue: load_due)
    victims = st.victims
    if victims is None:
        return PLAN_AGAIN if not touched.isdisjoint(st.reads.victims) else STANDS
    if touched.isdisjoint(victims):
        return STANDS
    # _batch_latest, with the latest start asked above where it was; where the
    # swap is not touched its latest start is the one its victims were read with
    # (it reads only the swap's queue and figures: a change there touches it)
    head = st.head
    latest: float | None = _NO_BATCH
    if head is not None and not head.urgent and head.overtakes < config.batch_bound:
        latest = start if asked else st.latest_start
    for name, sig in victims.items():
        if name in touched and _victim_sig(backends[name], latest, now, config) != sig:
            return VICTIMS_AGAIN
    return STANDS


def last_of(a: set[int], b: set[int], c: set[int]) -> int:
    """The last step in any of the three sets (-1: none)."""
    last = max(a) if a else -1
    if b:
        last = max(last, max(b))
    if c:
        last = max(last, max(c))
    return last


def head_moved(b: Backend, step: Step) -> bool:
    """Whether ``b``'s own step is stale: its state, its head or the head's
    urgency changed. Where only the overtakes changed (a request for
    a victim of its swap went first), an evicting plan is worked out again from
    the victims it chose (:func:`yard.core.reworks.overtaken_again`)."""
    if b.state is not step.state:
        return True
    head = b.head()
    return head is not step.head or (head is not None and head.urgent != step.urgent)


def waits_for_load(b: Backend) -> bool:
    """Whether ``b`` is a candidate of a planning round: stopped, failed or
    stopping, with requests waiting, wanted loaded (pinned, an operator's load)
    or work ahead near; a further instance whose profile the first load has not
    measured yet is loaded only for requests (:func:`~yard.core.instances.awaits_profile`)."""
    if b.state not in _WAITING_FOR_LOAD:
        return False
    if b.queue.size:
        return True
    return (b.want_load or b.ahead is not None) and not awaits_profile(b)
