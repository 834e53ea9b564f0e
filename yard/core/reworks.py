"""Evicting plans worked out again from the victims they chose, not afresh.

:class:`yard.core.planning.Planner` plans an evicting backend again when what
its plan read changed. Where all that changed is what decides how its chosen
victims make room (its head's overtakes, a victim busy or idle now, its service
times), whom each option evicts and in which order holds: only how each victim
goes (stopped, drained, serving first), the option taken and the sentences can
differ. These work the plan out again from there (:func:`~yard.core.placement.evict_again`),
giving what planning afresh gives, and answer None where they cannot vouch for
that (the round plans afresh then).
"""

from __future__ import annotations

from collections.abc import Collection

from yard.core import estimates, failures, placement, reasons
from yard.core.carry import carry_out
from yard.core.decisions import Decision
from yard.core.plan_steps import (
    Frontier,
    Step,
    frontier_after,
    reads_same,
    reuse_after,
    victim_sigs,
)
from yard.core.plans import Outcome, Plan, Reads, Room
from yard.core.queue import Req
from yard.core.records import Backend
from yard.core.spec import SchedulerConfig
from yard.core.state import Core
from yard.core.victims import family_of

Known = dict[str, tuple[object, frozenset[str], frozenset[str], int]]
"""The planner's options of each backend: (options, claims, books, number)."""


def _may(
    core: Core,
    told: Collection[tuple[object, ...]],
    known: Known,
    prev: Step,
    b: Backend,
    head: Req | None,
    frontier: Frontier,
    room: Room | None,
) -> bool:
    """Whether ``prev``'s plan may be worked out again after ``frontier``: its
    backend and head are as they were, it reads the same of ``frontier``, and no
    plan of this round would be told to it instead."""
    if (
        head is not prev.head
        or (head is not None and head.urgent != prev.urgent)
        or b.state is not prev.state
    ):
        return False
    if not (frontier is prev.before or frontier.same(prev.before)) and not reads_same(
        prev, frontier
    ):
        return False
    if room is not None and told:
        mine = known.get(b.name)
        if mine is None or mine[0] is not core.options(b):
            return False
        alone = None if b.profile is not None else failures.step(b)
        if (frontier, room, mine[3], alone, family_of(b, head)) in told:
            return False
    return True


def overtaken_again(
    core: Core,
    told: Collection[tuple[object, ...]],
    known: Known,
    prev: Step,
    b: Backend,
    frontier: Frontier,
    room: Room | None,
    now: float,
    out: list[Decision],
) -> tuple[Step, Room | None] | None:
    """``b``'s evicting plan worked out again where only its head's
    overtakes changed since (:func:`~yard.core.plan_steps.head_moved`) and it reads the same of
    ``frontier``, from the victims it chose (:func:`placement.evict_again`):
    which option it takes and whom it evicts read the overtakes only through
    whether the head may still be overtaken, so while that holds only its
    sentences change. None where planning afresh is needed: it stopped a
    victim, the head may be overtaken no more, another plan of this round
    would be told to it, or the plan worked out again evicts otherwise. With
    the room (it stops no victim: unchanged)."""
    plan = prev.plan
    config = core.config
    head = b.head()
    if (
        plan is None
        or plan.status != Outcome.EVICT
        or plan.stop
        or plan.made_room is None
        or head is None
        or head.overtakes >= config.batch_bound
        or prev.overtakes >= config.batch_bound
        or not _may(core, told, known, prev, b, head, frontier, room)
    ):
        return None
    if _recounted(plan, b, head, config):
        # The same step, its sentence telling the overtakes left (see _recounted).
        prev.overtakes = head.overtakes
        b.wait_reason = plan.reason
        carry_out(core, plan, out, head, now)
        if frontier is not prev.before:
            reuse_after(prev, frontier)
        return prev, room
    again = placement.evict_again(plan, head, core.devices, config, now)
    if (
        again.key() != plan.key()
        or again.stop
        or again.hold_until != plan.hold_until
        or again.drain != plan.drain
        or again.pending != plan.pending
    ):
        return None
    # Its victims read as they did (else it would be worked out again by
    # victims_again) and its latest start is as it was (else planned afresh:
    # plan_steps.evicting_changed): what it read of them stands.
    step = _carried(core, prev, b, head, again, prev.reads, frontier, now, out, same_victims=True)
    return step, room


def _recounted(plan: Plan, b: Backend, head: Req, config: SchedulerConfig) -> bool:
    """Whether ``plan``'s sentence was told again with its head's overtakes
    left: what :func:`placement.evict_again` gives for :func:`overtaken_again`,
    without working the victims out again. Each victim makes room as it did:
    the round plans it afresh where the clock ran out its batching, its head or
    latest start changed, or works it out from its victims where one changed in
    how it makes room (:func:`~yard.core.plan_steps.evicting_changed`); the
    head may still be overtaken. False (nothing changed) where a window's load
    is or becomes due, or the sentence's parts are not known."""
    if (
        plan.parts is None
        or plan.hold_until is not None
        or placement.load_due(b, head, config) is not None
    ):
        return False
    parts, batched = plan.parts
    more = config.batch_bound - head.overtakes
    for i, name in batched:
        parts[i] = reasons.serves_more_first(name, more)
    plan.reason = reasons.evicting(plan.room, parts)
    return True


def victims_again(
    core: Core,
    told: Collection[tuple[object, ...]],
    known: Known,
    prev: Step,
    b: Backend,
    frontier: Frontier,
    room: Room | None,
    now: float,
    out: list[Decision],
) -> tuple[Step, Room | None] | None:
    """``b``'s evicting plan worked out again where a victim changed only in
    what decides how it makes room (:func:`~yard.core.plan_steps.victim_sig`;
    its head's overtakes may have changed too) and it reads the same of
    ``frontier``: every option from the victims it chose
    (:func:`placement.evict_options_again`), the best taken as planning afresh
    takes it, and carried out. With the room after it: None where it stops a
    victim (surveyed again when a plan first needs it), else ``room`` as given
    (None: not surveyed yet; draining a victim or letting it serve first
    changes nothing a survey reads). None where planning afresh is needed."""
    plan = prev.plan
    config = core.config
    head = b.head()
    if (
        plan is None
        or plan.status != Outcome.EVICT
        or plan.stop
        or not prev.reads.plans
        or not _may(core, told, known, prev, b, head, frontier, room)
    ):
        return None
    again = placement.evict_options_again(prev.reads.plans, head, core.devices, config, now)
    if again is None or again[0].status != Outcome.EVICT:
        return None
    best, plans, until = again
    old = prev.reads
    reads = Reads(old.refusals, old.orders, True, old.victims, until, old.devices, plans)
    step = _carried(core, prev, b, head, best, reads, frontier, now, out)
    return step, None if best.stop else room


def _carried(
    core: Core,
    prev: Step,
    b: Backend,
    head: Req | None,
    plan: Plan,
    reads: Reads,
    frontier: Frontier,
    now: float,
    out: list[Decision],
    *,
    same_victims: bool = False,
) -> Step:
    """``b``'s new step with the evicting ``plan`` worked out again, reading
    ``reads`` and otherwise what ``prev`` read, with what it read of its victims
    where it stops none (as :meth:`yard.core.planning.Planner._plan` keeps it;
    ``same_victims``: as ``prev`` read them and its latest start); ``plan``
    carried out."""
    step = Step(
        b,
        b.state,
        head,
        head.urgent if head is not None else False,
        head.overtakes if head is not None else 0,
        plan,
        reads,
        prev.names,
        prev.claims,
        prev.books,
        frontier,
        None,
        prev.head_key,
        prev.why,
        prev.ordered,
    )
    if not plan.stop and same_victims and prev.victims is not None:
        step.latest_start = prev.latest_start
        step.victims = prev.victims
    elif not plan.stop:
        config = core.config
        step.latest_start = estimates.swap_latest_start(b, config)
        step.victims = victim_sigs(reads.victims, core.backends, b, head, now, config)
    b.wait_reason = plan.reason
    carry_out(core, plan, out, head, now)
    last = prev.plan
    if (
        frontier is prev.before
        and prev.after is not None
        and last is not None
        and plan.gpus == last.gpus
        and plan.status == last.status
        and (plan.need is last.need or plan.need == last.need)
        and (
            (plan.stop == last.stop and plan.drain == last.drain and plan.pending == last.pending)
            or set(plan.victims) == set(last.victims)
        )
    ):
        step.after = prev.after  # what frontier_after gives again
    else:
        step.after = frontier_after(plan, frontier)
    return step
