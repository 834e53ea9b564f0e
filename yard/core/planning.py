"""Planning the loads: which waiting backend loads next, where, and who makes room.

A round takes the backends that wait for a load (stopped, failed or stopping,
with requests waiting or wanted loaded), best waiting request first, and asks
:mod:`yard.core.placement` for each one's plan after what the backends before
it booked (memory), claimed (devices) and took (victims); then it carries the
plan out: start, stop or drain the victims, let pending victims serve first.

Rounds are incremental. A plan is a function of the backend's waiting head, what
the backends before it booked, claimed and took, and what it read of the rest:
the memory figures of the devices it weighed, whether a load runs where it
looked, the backends it considered as victims (their state, their best waiting
request, their place in the eviction order) and, when it evicts, its victims'
usage and the clock (batching holds until a known time). The event handlers
note what they change (``Core.touched``: a backend's state, queue or usage;
``Core.touched_devices``: a device's memory or loads), and a round plans afresh
only:

- every backend, when a profile or an operator's wish changed (``room_version``);
- a backend whose state or head changed (an arrival that ranks first, a cancel,
  urgency), and every backend whose place in the order moved with it;
- a backend whose plan read something noted since, where reading it again gives
  another answer (a victim now refused, the eviction order changed);
- an evicting plan whose head or latest start (its start-bys) changed, or whose
  batching the clock has run out; where one of its victims changed only in what
  decides how it makes room (:func:`victim_sig`: whether it serves first, is
  busy, its reload and service times), every option is worked out again from
  the victims it chose and the best taken
  (:func:`~yard.core.reworks.victims_again`); where only its head's overtakes
  changed (a request for a victim went first) and the head may still be
  overtaken, the plan is worked out again from the victims it chose
  (:func:`~yard.core.reworks.overtaken_again`): the overtakes change only its
  sentences;
- after a plan carried out in this round (a start, a stop, a drain), the plans
  after it that read what that changed (the same tests, on what it touched);
- a backend planned after a frontier that answers what its plan asked of it
  otherwise: whether the devices of its options are claimed, how much is booked
  there (only if it got past the claims), whether the backends it considered
  as victims are taken.

All other plans are reused as they are, with their effects on the frontier.
Shortcuts keep the cost of a round low with many backends:

- A touched backend is read again only where what plans may read of it (its
  refusal inputs, its eviction key: :func:`read_sig`) changed since the steps
  last agreed with it; when only its best waiting request changed, only by the
  plans whose head ranks between the old and the new one (the others' refusal
  cannot change: :func:`~yard.core.rereads.between`), and its place in eviction orders
  only by the plans whose orders held it. Plans that took it, or that it
  outranks, get the same refusal: it is worked out once for each kind.
- Within a round, a plan that stopped at its first checks (claims, another
  load), or a blocked one whose every considered victim refused, is *told
  again* to the backends after it with the same options and the same frontier
  instead of being worked out again: candidates come best head first, and a
  victim that refuses a request (pinned, not loaded, taken, or outranking it)
  refuses every request ranked lower, so the checks come out the same and
  only the name in the reason differs (and where the backend was told the
  same last round, not even that: its sentence is kept).

The result is the same as planning every backend afresh on every event:
``tests/core/test_machine.py`` (Hypothesis) and ``tests/core/test_planning.py``
(a seeded busy GPU of eight models, model zoos of twelve and thirty on two
GPUs) check exactly that after every event,
against a scheduler made with ``replan_everything=True``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable

from yard.core import estimates, failures, placement, reasons
from yard.core.carry import carry_out, reprieve
from yard.core.decisions import Decision
from yard.core.lifecycle import BackendState
from yard.core.plan_steps import (
    EMPTY,
    PLAN_AGAIN,
    VICTIMS_AGAIN,
    Frontier,
    Key,
    Sig,
    Step,
    Told,
    common_tail,
    evicting_changed,
    frontier_after,
    head_moved,
    last_of,
    only_key,
    quiet_from,
    ranks_no_higher,
    read_sig,
    reads_same,
    reuse_after,
    still_reads,
    victim_sigs,
    waits_for_load,
)
from yard.core.plans import Outcome, Plan, Reads, Room
from yard.core.queue import Req, order_key
from yard.core.records import Backend
from yard.core.rereads import between, index_reads, reindex_fresh, reread
from yard.core.reworks import overtaken_again, victims_again
from yard.core.spec import HOST
from yard.core.state import Core

_OptionsSig = tuple[tuple[tuple[str, ...], tuple[tuple[str, int], ...]], ...]

_FEW_READERS = 4
"""Up to this many plans that read a touched backend are checked again
directly (:func:`still_reads`) rather than through its signature."""

_FEW_FRESH = 8
"""Up to this many steps planned afresh in a round are indexed one by one;
more, and the steps are indexed afresh (:meth:`Planner._keep`)."""

_NOTHING: frozenset[str] = frozenset()

_BLOCKED = Outcome.BLOCKED


class Planner:
    """Plans and carries out loads, one round per pass of the scheduler.

    replan_everything: plan every waiting backend afresh in every round (the
    reference the incremental rounds are tested against; slower).
    """

    def __init__(self, core: Core, *, replan_everything: bool = False) -> None:
        self._core = core
        self._everything = replan_everything
        self._version = -1  # room_version the steps were planned at (-1: plan afresh)
        self._steps: list[Step] = []
        self._order: list[Backend] = []  # the steps' backends
        self._index: dict[str, int] = {}  # backend -> its step
        self._readers: dict[str, set[int]] = {}  # backend -> the steps that read it
        # backend -> the steps that read its place in an eviction order (Step.ordered)
        self._orderers: dict[str, set[int]] = {}
        self._weighers: dict[str, set[int]] = {}  # device -> the steps that weighed its memory
        self._evicting: set[int] = set()  # the steps that chose victims
        self._effects: list[int] = []  # the steps that booked, claimed or took
        # per backend: its options, the devices whose claim and booking its plan may read
        # and the number of its options' figures
        self._devices: dict[str, tuple[object, frozenset[str], frozenset[str], int]] = {}
        self._sigs: dict[_OptionsSig, int] = {}
        # per backend in the order: its rank there (see _ordered), and the steps' ranks
        self._ranks: dict[str, tuple[int, Key]] = {}
        self._rank_list: list[tuple[int, Key]] = []
        # this round's blocked plans, told again to the backends after them
        self._told: dict[tuple[Frontier, Room, int, failures.Step | None, str | None], Told] = {}
        # per backend: what plans may read of it (:func:`read_sig`) when the
        # steps were last known to agree with it
        self._seen: dict[str, Sig] = {}
        # this round's steps of which only the head's overtakes changed (:func:`head_moved`)
        self._overtaken: set[int] = set()
        # this round's evicting steps of which a victim changed only in how it
        # makes room (:func:`~yard.core.plan_steps.evicting_changed`; see yard.core.reworks)
        self._resig: set[int] = set()
        self.started = False  # the last round started a load (see Scheduler._plan_loads)

    def round(self, now: float, out: list[Decision]) -> None:
        """Plan the loads and carry out what the plans say."""
        core = self._core
        touched = core.touched
        full = self._everything or core.room_version != self._version
        old = self._steps
        if full:
            self._ranks.clear()
            cands = self._ordered([b for b in core.backends.values() if waits_for_load(b)], None)
        elif self._order_kept(touched):
            cands = self._order
        else:
            cands = self._reordered(touched)
        self._told.clear()
        self._overtaken.clear()
        self._resig.clear()
        self.started = False
        if full:
            self._seen.clear()
            # profiles may have changed: number the options afresh
            self._sigs.clear()
            self._devices.clear()
        dirty = set() if full else self._dirty(touched, now, settled=True)
        for device in core.touched_devices:
            dirty.update(self._weighers.get(device, ()))
        core.unsettled |= touched
        touched.clear()
        core.touched_devices.clear()
        core.overtaken.clear()
        index = {} if full else self._index
        steps: list[Step] = []
        fresh: list[int] = []
        frontier = EMPTY
        room: Room | None = None
        overtaken_, resig = self._overtaken, self._resig
        told, known = self._told, self._devices
        last_dirty = last_of(dirty, overtaken_, resig)
        seen = core.transitions
        order = self._order
        common = -1  # how many backends cands and the old order end with alike (-1: not counted)
        # the frontier that quiet_k was worked out for: from quiet_k on, the old steps
        # change no frontier and read it as they read theirs (plan_steps.quiet_from)
        quiet: Frontier | None = None
        quiet_k = 0
        for i, b in enumerate(cands):
            if core.transitions != seen and not full:
                # A plan was carried out: the plans after it that read what it
                # changed are planned again, the others stand.
                seen = core.transitions
                self._dirty(touched, now, settled=False, dirty=dirty)
                for device in core.touched_devices:
                    dirty.update(self._weighers.get(device, ()))
                last_dirty = last_of(dirty, overtaken_, resig)
            k = index.get(b.name)
            prev = old[k] if k is not None and k not in dirty else None
            if prev is not None and (k in resig or k in overtaken_):
                rework = victims_again if k in resig else overtaken_again
                worked = rework(core, told, known, prev, b, frontier, room, now, out)
                if worked is not None:
                    step, room = worked
                    steps.append(step)
                    fresh.append(i)
                    frontier = step.after or frontier
                    continue
                prev = None
            if k is not None and prev is not None:
                before = prev.before
                same = frontier is before or frontier.same(before)
                if k > last_dirty:
                    # the rest of the round is the old one's order: cands[i:] == order[k:]
                    if cands is order:
                        rest = i == k
                    else:
                        if common < 0:
                            common = common_tail(cands, order)
                        rest = len(cands) - i == len(order) - k and len(cands) - i <= common
                else:
                    rest = False
                if rest and same:
                    # The rest is as it was: replay what changed the frontier.
                    for e in self._effects:
                        if e >= k:
                            self._replay(old[e], out)
                            frontier = old[e].after or frontier
                    steps.extend(old[k:])
                    break
                if rest and quiet is not frontier:
                    quiet, quiet_k = frontier, quiet_from(old, frontier)
                if rest and k >= quiet_k:
                    # The rest changes no frontier and reads nothing in which
                    # this one differs from theirs: each reused after it.
                    for st in old[k:]:
                        st.before = frontier
                    steps.extend(old[k:])
                    break
                if same or reads_same(prev, frontier):
                    if not same:
                        reuse_after(prev, frontier)
                    steps.append(prev)
                    if prev.after is not None:
                        self._replay(prev, out)
                        frontier = prev.after
                    continue
            if room is None:
                room = core.survey()
            step, room = self._plan(b, frontier, room, now, out)
            steps.append(step)
            fresh.append(i)
            if step.after is not None:
                frontier = step.after
        self._keep(steps, cands, fresh)
        victim_of: dict[str, Req] = {}
        for e in self._effects:
            st = steps[e]
            if st.head is not None and st.plan is not None and st.plan.status == Outcome.EVICT:
                for v in st.plan.pending:
                    victim_of[v.name] = st.head
        reprieve(self._core, frontier.taken, victim_of)
        # What this round carried out is in core.touched and touched_devices:
        # the next round revisits the plans that read it (the plans before a
        # carry-out read its backends as they were, so no signature vouches).
        for name in touched:
            self._seen.pop(name, None)
        self._version = core.room_version

    def _keep(self, steps: list[Step], order: list[Backend], fresh: list[int]) -> None:
        """Remember this round's steps and the indexes into them."""
        reindex = (
            order is not self._order
            or len(steps) != len(self._steps)
            or len(fresh) > _FEW_FRESH  # indexing afresh shares the told plans' reads
        )
        old = self._steps
        self._steps = steps
        if not reindex:  # the same order: only the fresh steps are indexed again
            indexes = (self._readers, self._orderers, self._weighers, self._evicting)
            if fresh and reindex_fresh(old, steps, fresh, *indexes):
                self._effects = [k for k, st in enumerate(steps) if st.after is not None]
            return
        self._order = list(order)
        names = [b.name for b in order]
        self._index = dict(zip(names, range(len(names)), strict=True))
        self._rank_list = list(map(self._ranks.__getitem__, names))
        readers, orderers, weighers, self._evicting, self._effects = index_reads(steps)
        self._readers, self._orderers, self._weighers = readers, orderers, weighers

    def _ordered(self, cands: list[Backend], touched: set[str] | None) -> list[Backend]:
        """``cands`` best first: those wanted loaded or with no head (by name),
        then by their head's :func:`~yard.core.queue.order_key`. A backend's
        rank changes only with its head or its wish to load, so only the
        ``touched`` ones (None: all) are ranked again."""
        boost = self._core.config.deadline_boost
        ranks = self._ranks
        for b in cands:
            if touched is None or b.name in touched or b.name not in ranks:
                head = b.head()
                if b.want_load or head is None:
                    ranks[b.name] = (0, (0.0, 0.0, b.name))
                else:
                    ranks[b.name] = (1, order_key(head, boost))
        ordered = sorted(cands, key=lambda b: ranks[b.name])
        # the same order kept as the same list: the round's indexes into it stand
        return self._order if touched is not None and ordered == self._order else ordered

    def _reordered(self, touched: set[str]) -> list[Backend]:
        """The candidates best first after the ``touched`` backends changed:
        only they can join, leave or move (a backend's rank and whether it
        waits for a load change only with what touches it, as
        :meth:`_order_kept` relies on), so the others keep their order and
        each touched one that waits is put in its place: what :meth:`_ordered`
        gives, without sorting them all (where a rank ties another's, it sorts)."""
        backends = self._core.backends
        kept = [b for b in self._order if b.name not in touched]
        moved = [backends[n] for n in sorted(touched) if waits_for_load(backends[n])]
        if not moved:
            return self._order if len(kept) == len(self._order) else kept
        boost = self._core.config.deadline_boost
        ranks = self._ranks
        for b in moved:
            head = b.head()
            if b.want_load or head is None:
                ranks[b.name] = (0, (0.0, 0.0, b.name))
            else:
                ranks[b.name] = (1, order_key(head, boost))
        rank_of = ranks.__getitem__
        for b in moved:
            rank = ranks[b.name]
            at = bisect_right(kept, rank, key=lambda o: rank_of(o.name))
            if at and ranks[kept[at - 1].name] == rank:
                cands = [o for o in self._order if waits_for_load(o)]
                index = self._index
                cands += [o for o in moved if o.name not in index]
                return self._ordered(cands, touched)
            kept.insert(at, b)
        return self._order if kept == self._order else kept

    def _order_kept(self, touched: set[str]) -> bool:
        """Whether no touched backend joined, left or moved in the order."""
        for name in touched:
            b = self._core.backends[name]
            k = self._index.get(name)
            if k is None:
                if waits_for_load(b):
                    return False
                continue
            # the head's overtakes alone do not move it (order_key does not read them)
            if not waits_for_load(b) or head_moved(b, self._steps[k]):
                return False
        return True

    def _dirty(
        self, touched: set[str], now: float, *, settled: bool, dirty: set[int] | None = None
    ) -> set[int]:
        """The steps whose own inputs changed: their head, what they read of a
        touched backend, or (evicting) their own queue, their victims and the
        clock.

        settled: every step agrees with the backends as they are now except in
        what ``touched`` names (the start of a round). Then a touched backend
        whose :func:`read_sig` is the one the steps last agreed with is not
        read again, and its signature is remembered; otherwise (plans carried
        out in this round) the touched backends' signatures are forgotten.

        dirty: the steps already known to be planned again (this round's so
        far), added to and returned; they are not asked again.
        """
        if dirty is None:
            dirty = set()
        steps = self._steps
        config = self._core.config
        backends = self._core.backends
        for k in self._evicting:
            if k in dirty:
                continue
            what = evicting_changed(steps[k], touched, backends, now, config)
            if what == PLAN_AGAIN:
                dirty.add(k)
            elif what == VICTIMS_AGAIN:
                self._resig.add(k)
        boost = config.deadline_boost
        seen = self._seen
        for name in touched:
            readers = self._readers.get(name)
            # With few readers reading again costs less than the signature.
            if readers and settled and len(readers) > _FEW_READERS:
                o = backends[name]
                sig = read_sig(o, boost)
                old = seen.get(name)
                seen[name] = sig
                # what may have changed: its refusals, its place in eviction orders
                if old is None:
                    refused = ordered = True
                else:  # old[:5] != sig[:5], without the slices
                    refused = (
                        old[0] != sig[0]
                        or old[1] != sig[1]
                        or old[2] != sig[2]
                        or old[3] != sig[3]
                        or old[4] != sig[4]
                    )
                    ordered = old[5] != sig[5]
                if refused:
                    check: Iterable[int] = readers
                    if old is not None and only_key(old, sig):
                        check = between(self._rank_list, readers, old[2], sig[2])
                    reread(self._steps, o, sig[2], check, dirty, refused=True)
                if ordered:
                    reread(
                        self._steps, o, sig[2], self._orderers.get(name, ()), dirty, refused=False
                    )
            else:
                seen.pop(name, None)  # no step vouches for what it read
                if readers:
                    o = backends[name]
                    o_head = o.head()
                    key = None if o_head is None else order_key(o_head, boost)
                    if len(readers) > _FEW_READERS:
                        reread(self._steps, o, key, readers, dirty, refused=True)
                        reread(
                            self._steps, o, key, self._orderers.get(name, ()), dirty, refused=False
                        )
                    else:  # a few: each asked everything at once
                        for k in readers:
                            if k not in dirty and not still_reads(
                                steps[k], o, o_head, key, True, True
                            ):
                                dirty.add(k)
            own = self._index.get(name)
            if own is not None:
                st = steps[own]
                if head_moved(st.backend, st):
                    dirty.add(own)
                elif st.head is not None and st.head.overtakes != st.overtakes:
                    self._overtaken.add(own)  # only its head's overtakes changed
        for name in self._core.overtaken if settled else ():
            # a request for a victim went first: nothing else of the swap changed
            own = self._index.get(name)
            if own is not None and name not in touched:
                st = steps[own]
                if st.head is not None and st.head.overtakes != st.overtakes:
                    self._overtaken.add(own)
        return dirty

    def _plan(
        self, b: Backend, frontier: Frontier, room: Room, now: float, out: list[Decision]
    ) -> tuple[Step, Room | None]:
        """Plan ``b`` afresh after ``frontier`` and carry the plan out; with the
        room after it (None where it started or stopped a backend: surveyed
        again when a plan after it needs it, which most rounds' do not)."""
        core = self._core
        head = b.head()
        urgent = head.urgent if head is not None else False
        overtakes = head.overtakes if head is not None else 0
        if b.state is BackendState.STOPPING:
            b.wait_reason = reasons.waiting_for_stop(b.name)
            none = _NOTHING
            step = Step(
                b, b.state, head, urgent, overtakes, None, Reads(), none, none, none, frontier, None
            )
            return step, room
        options = core.options_cache.get(b.name) or core.options(b)
        known = self._devices.get(b.name)
        if known is None or known[0] is not options:
            claims = frozenset(d for gpus, _ in options for d in gpus or (HOST,))
            # backends with equal options share a number (a cheap key)
            same = tuple((gpus, tuple(sorted(need.items()))) for gpus, need in options)
            sig = self._sigs.setdefault(same, len(self._sigs))
            known = (options, claims, claims | {HOST}, sig)
            self._devices[b.name] = known
        _, claims, books, sig = known
        rank = self._ranks.get(b.name)
        if rank is not None and rank[0] == 1:
            head_key: Key | None = rank[1]  # its place in the order is its head's key
        else:
            head_key = None if head is None else order_key(head, core.config.deadline_boost)
        # A plan that stops at its first checks (claims, loads), or a blocked
        # one whose every refusal holds for a request ranked no higher, holds
        # for the backends after it with the same options, after the same
        # frontier: it is told again, not worked out again.
        alone = None if b.profile is not None else failures.step(b)
        family = b.family  # family_of(b, head), asked here for every backend told again
        if family is not None and head is not None and head is not b.ahead:
            family = None
        key = (frontier, room, sig, alone, family)  # siblings refuse their own
        told = self._told.get(key)
        plan: Plan | None
        retold: Callable[[str], str] | None = None  # a blocked plan told again: its sentence
        if told is not None and (told.at_once or ranks_no_higher(head_key, told.head_key)):
            best = told.plan
            assert best is not None and best.retell is not None
            if best.status is _BLOCKED:
                # It carries nothing out and nobody reads its plan but its
                # step: it shares the plan, and its sentence is made when it is
                # read (:attr:`~yard.core.records.Backend.wait_reason`).
                plan = best
                retold = best.retell
            else:
                # its own need where the plan loads (the options are alike)
                need = next(n for g, n in options if g == best.gpus)
                # blocked or waiting, it has no victims: it shares the empty lists
                k = self._index.get(b.name)
                last = self._steps[k].plan if k is not None and k < len(self._steps) else None
                if last is not None and last.backend is b and last.retell == best.retell:
                    text = last.reason  # told the same before: the same sentence
                else:
                    text = best.retell(b.name)
                plan = Plan(
                    b, best.gpus, best.status, text, need, best.stop, best.drain, best.pending
                )
                plan.retell = best.retell
        else:
            reads = Reads()
            plan = placement.blocked_at_once(b, options, frontier.claimed, room, reads)
            if plan is not None:
                # it read no backend (it stopped at claims and loads)
                told = Told(plan, reads, _NOTHING, {}, _NOTHING, head_key, at_once=True)
            else:
                reads = Reads()
                plan = core.best_plan(
                    b, head, frontier.booked, frontier.claimed, frontier.taken, now, room, reads
                )
                why = {o.name: why_not for o, why_not in reads.refusals}
                long = [order for order in reads.orders if len(order) > 1]
                ordered = frozenset(o.name for order in long for o in order) if long else _NOTHING
                told = Told(plan, reads, reads.backends(), why, ordered, head_key)
            if plan is not None and plan.retell is not None and None not in told.why.values():
                self._told[key] = told
        if told.at_once:
            books = _NOTHING
        step = Step(
            b,
            b.state,
            head,
            urgent,
            overtakes,
            plan,
            told.reads,
            told.names,
            claims,
            books,
            frontier,
            None,
            head_key,
            told.why,
            told.ordered,
        )
        if plan is None:
            b.wait_reason = reasons.no_place(b.name)
            return step, room
        if retold is not None:
            b.waiting_why = retold
            return step, room
        if plan.status == Outcome.EVICT and not plan.stop:
            # As it read them, before it is carried out. (A plan that starts,
            # or stops a victim, is planned again when a victim is touched:
            # the stop changes it anyway.)
            step.latest_start = estimates.swap_latest_start(b, core.config)
            step.victims = victim_sigs(told.reads.victims, core.backends, b, head, now, core.config)
        b.waiting_why = plan.reason  # (Backend.wait_reason)
        status = plan.status
        if status is Outcome.START:
            core.start(plan, now, out)
            self.started = True
            step.after = frontier_after(plan, frontier)
            return step, None
        if status is _BLOCKED:
            return step, room
        if plan.stop or plan.drain or plan.pending:
            carry_out(core, plan, out, head, now)
        step.after = frontier_after(plan, frontier)
        return step, None if plan.stop else room

    def _replay(self, step: Step, out: list[Decision]) -> None:
        """Carry out a reused evicting plan again (it changes nothing: its
        victims already drain or serve first)."""
        if step.plan is not None and step.plan.status == Outcome.EVICT:
            carry_out(self._core, step.plan, out)
