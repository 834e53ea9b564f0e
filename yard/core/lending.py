"""Room lent to an app ahead of its share, and given back.

Rules it keeps
--------------

- Only with app weights (``[apps.NAME] weight``, :mod:`yard.core.fairness`).
  Without them the core never lends and decides exactly as without this module.
- A load for a request whose app is ahead of its share (its lead,
  :meth:`~yard.core.fairness.Shares.lead_s`, is above zero) that stops an idle
  backend last asked for, within :data:`GIVE_BACK_WITHIN_S`, by an app of a
  higher weight *borrows* that backend's room: the victim is stopped as
  placement says (nothing waits for it, it is idle), and the core remembers
  the loan. Apps of equal weight (every app without one) lend nothing: the
  show art's load stops the newsroom's model as before.
- Once the borrower has nothing to do (no request waits for it, none runs on
  it) and no request waits for any load, the core loads the victim back, as an
  operator's load would be made: for no request, so only idle backends that
  nobody waits for make room (the borrower first, by placement's eviction
  order). A request that comes to a stopped backend withdraws the wish until no
  request waits for a load again.
- A loan ends when the victim is loaded again (for a request or given back),
  or when its latest request is older than :data:`GIVE_BACK_WITHIN_S` (its
  demand went stale: it is not loaded back), and when an operator loads,
  unloads, pins or unpins the victim: from then on the wish is the operator's,
  and a withdrawn give-back does not take an operator's kept load with it.

Why: a flood of low-priority renders from an app with a small weight finds the
image model stopped and loads it; the backend that frees enough by itself is
often the one a higher-priority app uses every hour (the newsroom's LLM), idle
between its uses. Placement may take that room (it makes the render wait for
no one), but the room is the newsroom's: once the renders are done it goes
back, so the newsroom's next burst does not pay the load. A load the core makes
on its own can delay a request that arrives during it by one load; the wait
bound counts it (``docs/wait-bound.md``, "With app weights").
"""

from __future__ import annotations

from yard.core import reasons
from yard.core.lifecycle import BackendState
from yard.core.queue import Req
from yard.core.records import Backend, Loan
from yard.core.state import Core

GIVE_BACK_WITHIN_S = 3600.0
"""A backend stopped for an app ahead of its share is loaded back only while
its latest request is at most this old: an hourly job's model is, one unused
for longer is not."""


_WAITING_FOR_LOAD = (BackendState.STOPPED, BackendState.FAILED, BackendState.STOPPING)
_STOPPED = (BackendState.STOPPED, BackendState.STOPPING)


def lend(core: Core, victim: Backend, borrower: Backend, head: Req | None, now: float) -> str:
    """Note that stopping idle ``victim`` for ``borrower``'s load for ``head``
    lends its room, where it does (see the module docstring); return the words
    the stop's reason adds ("" where it lends nothing)."""
    shares = core.shares
    if (
        shares is None
        or head is None
        or victim.pinned
        or now - victim.last_arrival > GIVE_BACK_WITHIN_S
        or shares.weight(head.app) >= shares.weight(victim.last_app)
        or shares.lead_s(head.app) <= 0.0
    ):
        return ""
    core.loans[victim.name] = Loan(borrower.name, head.app)
    return reasons.lent_room(head.app, victim.name, borrower.name)


def give_back(core: Core, now: float) -> None:
    """Wish the victims of loans loaded back whose borrowers have nothing to
    do while no request waits for a load; withdraw the wish otherwise; end the
    loans that are repaid or stale. Called before each planning round, where it
    costs nothing without loans."""
    loans = core.loans
    waiting: bool | None = None  # whether a request waits for a load (asked once)
    for name in sorted(loans):
        loan = loans[name]
        v = core.backends.get(name)
        if v is None or v.retiring is not None or v.state not in _STOPPED:
            # loading or loaded again, or its start failed (yard does not
            # retry it on its own), or leaving the configuration
            del loans[name]
            if v is not None and loan.wished and v.state in _STOPPED:
                v.want_load = False
                core.room_version += 1
            continue
        stale = now - v.last_arrival > GIVE_BACK_WITHIN_S
        if stale:
            del loans[name]
            wish = False
        else:
            b = core.backends.get(loan.borrower)
            idle = b is None or (not b.queue.size and not b.running)
            if idle and waiting is None:
                waiting = any(
                    (o.queue.size or o.ahead is not None) and o.state in _WAITING_FOR_LOAD
                    for o in core.backends.values()
                )
            wish = idle and not waiting
        if wish != loan.wished:
            loan.wished = wish
            v.want_load = wish
            core.room_version += 1  # every plan afresh: a wish to load is new or gone
