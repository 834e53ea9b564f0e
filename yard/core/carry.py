"""Carrying out a round's plans (:class:`yard.core.planning.Planner`): make
room as an evicting plan says, and let backends drained for a swap that no
plan needs any more serve again. Every change goes through the core's
transitions, with its reason.
"""

from __future__ import annotations

from yard.core import lending, reasons
from yard.core.decisions import Decision
from yard.core.lifecycle import BackendState, Move
from yard.core.plans import Plan
from yard.core.queue import Req
from yard.core.state import Core


def carry_out(
    core: Core, plan: Plan, out: list[Decision], head: Req | None = None, now: float = 0.0
) -> None:
    """Make room as an evicting plan for ``head`` says: stop the idle victims
    (lending their room where :func:`yard.core.lending.lend` says, at ``now``),
    drain the busy ones, let the pending ones serve first. A plan carried out
    again (no victim left to stop) needs no ``head``."""
    b = plan.backend
    for v in plan.stop:
        core.inflation = max(core.inflation, v.credit)
        moves = v.places > 1
        stop_why = reasons.stopping_for_room(b.name, plan.room, core.load_s(v), moves)
        core.stop(v, stop_why + lending.lend(core, v, b, head, now), out)
    for v in plan.drain:
        if v.state is BackendState.READY:
            held = plan.hold_until is not None and not v.busy()
            why = reasons.holding_for_room if held else reasons.draining_for_room
            core.transition(v, Move.DRAIN, why(b.name, plan.room))
        v.drain_reason = "swap"
    for v in plan.pending:
        if v.state is BackendState.DRAINING and v.drain_reason == "swap":
            core.transition(v, Move.UNDRAIN, reasons.serving_before_swap(b.name))
            v.drain_reason = None


def reprieve(core: Core, taken: set[str], victim_of: dict[str, Req]) -> None:
    """Backends drained for a swap that no plan needs any more serve again."""
    if not core.draining:
        core.victim_of = victim_of
        return
    for name in sorted(core.draining - taken):
        b = core.backends[name]
        if b.drain_reason == "swap":
            core.transition(b, Move.UNDRAIN, "ready again: the swap no longer needs its memory")
            b.drain_reason = None
    core.victim_of = victim_of
