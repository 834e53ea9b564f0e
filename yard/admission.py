"""One request's turn: its :class:`Admission` in the engine, and :func:`run_turn`,
the one loop every holder of a request runs (the gateway for a synchronous
request, the job service for a job).

Theory of operation. :meth:`yard.engine.Engine.submit` returns an Admission.
Its holder waits for the core to dispatch it, sends the request to the
backend, and reports how that went. If the upstream connection broke before
anything reached the client, the report is ``upstream_lost`` and the core
gives a verdict: yard caused the crash (an out-of-memory while it had
over-committed), so the request goes back to its old place in the queue and is
dispatched again; or not, and it ends with ``backend_failed``. :func:`run_turn`
is that loop, written once.

An Admission moves through the states of :data:`MOVES` and nothing else: the
engine moves it on the core's decisions (dispatch, requeue, reject), its holder
on its report and cancel. Each move is entered in the engine's
:class:`AdmissionBook` (which requests are live, how many wait, how many are in
flight, how they ended), so the engine's counts are the sum of the moves.

Rules this module keeps:

- Sync to the holder: :meth:`Admission.report` and :meth:`Admission.cancel`
  never block; they hand the core an event through the engine's ``send``.
- Every request ends exactly once: a report that belongs to a dispatch the
  core has since taken back (a requeue) is dropped, and so is a second report.
- Nothing is polled: a waiter sleeps on an event that the next move sets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import trio

from yard.core.events import Event, Outcome, RequestCancelled, RequestFinished
from yard.errors import Rejected

__all__ = [
    "MOVES",
    "Admission",
    "AdmissionBook",
    "AdmissionLike",
    "Assignment",
    "ResponseCut",
    "UpstreamLost",
    "run_turn",
]

State = Literal["queued", "dispatched", "lost", "done", "rejected", "cancelled"]

MOVES: dict[State, frozenset[State]] = {
    # Waiting for the core: dispatched, refused, or the client left.
    "queued": frozenset({"dispatched", "rejected", "cancelled"}),
    # At the backend: reported (done, or lost before any byte reached the
    # client), taken back by the core (requeue), ended by it, or cancelled.
    "dispatched": frozenset({"done", "lost", "queued", "rejected", "cancelled"}),
    # Reported lost, awaiting the core's verdict: requeued (or dispatched
    # again at once), or ended.
    "lost": frozenset({"queued", "dispatched", "rejected", "cancelled"}),
    "done": frozenset(),
    "rejected": frozenset(),
    "cancelled": frozenset(),
}
"""Every legal move of an Admission, from state to states."""

_WAITING: frozenset[State] = frozenset({"queued", "lost"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Assignment:
    """Where a dispatched request goes: the backend and the URL it listens on."""

    request_id: str
    backend: str
    base_url: str


class AdmissionBook:
    """The engine's book of the requests it holds: each live Admission by
    request id, how many wait (queued, or lost awaiting a verdict), how many
    are in flight, both also by app (``queued_by_app``, ``inflight_by_app``:
    apps with none are left out), and how many ended by outcome (``ok``,
    ``error``, ``rejected``, ``cancelled``). Only Admissions' moves write it."""

    __slots__ = ("_live", "inflight", "inflight_by_app", "outcomes", "queued", "queued_by_app")

    def __init__(self) -> None:
        self._live: dict[str, Admission] = {}
        self.queued = 0
        self.inflight = 0
        self.queued_by_app: dict[str, int] = {}
        self.inflight_by_app: dict[str, int] = {}
        self.outcomes: dict[str, int] = {}

    def get(self, request_id: str) -> Admission | None:
        """The live admission of ``request_id`` (None once it has ended)."""
        return self._live.get(request_id)

    def __len__(self) -> int:
        return len(self._live)

    def enter(self, admission: Admission) -> None:
        """A new queued admission. Raises ValueError for an id in use."""
        if admission.request_id in self._live:
            raise ValueError(f"request id {admission.request_id!r} is already in use")
        self._live[admission.request_id] = admission
        self.queued += 1
        _add(self.queued_by_app, admission.app, 1)

    def close(self, rejected: Rejected) -> None:
        """End every live admission with ``rejected`` (yard is stopping); not
        counted as outcomes: nobody reported them."""
        live, self._live = self._live, {}
        for admission in live.values():
            admission._end_quietly(rejected)
        self.queued = 0
        self.inflight = 0
        self.queued_by_app.clear()
        self.inflight_by_app.clear()

    def _moved(self, admission: Admission, old: State, new: State, outcome: str | None) -> None:
        app = admission.app
        if old == "dispatched":
            self.inflight -= 1
            _add(self.inflight_by_app, app, -1)
        else:
            self.queued -= 1
            _add(self.queued_by_app, app, -1)
        if new == "dispatched":
            self.inflight += 1
            _add(self.inflight_by_app, app, 1)
        elif new in _WAITING:
            self.queued += 1
            _add(self.queued_by_app, app, 1)
        else:
            del self._live[admission.request_id]
            if outcome is not None:
                self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def _add(counts: dict[str, int], app: str, delta: int) -> None:
    left = counts.get(app, 0) + delta
    if left:
        counts[app] = left
    else:
        del counts[app]


class Admission:
    """One request's handle, returned by :meth:`yard.engine.Engine.submit`.

    The holder runs :func:`run_turn` with it (or, by hand: awaits
    :meth:`wait_dispatched`, sends the request to the :class:`Assignment`'s URL,
    then calls :meth:`report` once with the outcome; after ``upstream_lost`` it
    awaits :meth:`wait_dispatched` again).
    """

    __slots__ = (
        "_assignment",
        "_book",
        "_rejected",
        "_send",
        "_state",
        "_wakeup",
        "app",
        "arrived_at",
        "backend",
        "queued_s",
        "request_id",
    )

    def __init__(
        self,
        *,
        request_id: str,
        backend: str,
        arrived_at: float,
        send: Callable[[Event], None],
        book: AdmissionBook | None,
        app: str = "",
    ) -> None:
        """send: hands an event to the core (the engine's). book: the engine's
        book, which the caller enters this admission in (None: never entered,
        for one refused at once). app: the app the request belongs to."""
        self._send = send
        self._book = book
        self.app = app
        self.request_id = request_id
        self.backend = backend
        self.arrived_at = arrived_at
        self.queued_s = 0.0
        self._state: State = "queued"
        self._assignment: Assignment | None = None
        self._rejected: Rejected | None = None
        self._wakeup: trio.Event | None = None

    @property
    def state(self) -> State:
        """``queued``, ``dispatched``, ``lost`` (awaiting the core's verdict after an
        ``upstream_lost`` report), ``done``, ``rejected`` or ``cancelled``."""
        return self._state

    @property
    def assignment(self) -> Assignment | None:
        """Where the request goes, if it is dispatched right now (else None).

        For a caller on a hot path: a request submitted to an idle engine is
        often dispatched inside :meth:`Engine.submit`, and reading this spares
        the checkpoint that :meth:`wait_dispatched` always is (on a cold CPU a
        trip through Trio's run loop costs tens of microseconds).
        """
        return self._assignment if self._state == "dispatched" else None

    async def wait_dispatched(self) -> Assignment:
        """Wait until the core dispatches the request and return where it goes.

        Raises :class:`Rejected` if the core ends it instead, if it was cancelled, or
        if the engine shuts down. After a requeue it returns the next dispatch. Called
        again while dispatched, it returns the same assignment. Calling it after a
        final report is a programming error (``RuntimeError``).
        """
        waited = False
        while True:
            state = self._state
            if state in _WAITING:
                await self._wait_move()
                waited = True
                continue
            if not waited:
                # Every call is a checkpoint, even when the answer is already there.
                await trio.lowlevel.checkpoint()
            if state == "dispatched":
                assert self._assignment is not None
                return self._assignment
            if state == "rejected":
                assert self._rejected is not None
                raise self._rejected
            if state == "cancelled":
                raise Rejected(status=499, code="cancelled", message="the request was cancelled")
            raise RuntimeError(f"request {self.request_id} was already reported finished")

    async def wait_verdict(self) -> bool:
        """After an ``upstream_lost`` report: wait for the core's verdict. True
        if the request is back in the queue (or already dispatched again),
        False if it has ended (:meth:`wait_dispatched` then raises why)."""
        while self._state == "lost":
            await self._wait_move()
        await trio.lowlevel.checkpoint()
        return self._state in ("queued", "dispatched")

    def report(self, outcome: Outcome = "ok", detail: str = "") -> None:
        """The dispatched request is over (see :class:`~yard.core.events.RequestFinished`
        for the outcomes). A no-op unless the request is currently dispatched."""
        if self._state != "dispatched":
            return
        if outcome == "upstream_lost":
            self._move("lost")
        else:
            self._move("done", outcome)
        self._send(RequestFinished(request_id=self.request_id, outcome=outcome, detail=detail))

    def cancel(self) -> None:
        """The client is gone (disconnect, job deleted). Idempotent; a no-op once the
        request has ended."""
        if not MOVES[self._state]:
            return
        self._move("cancelled", "cancelled")
        self._send(RequestCancelled(request_id=self.request_id))

    # -- moved by the engine ---------------------------------------------------

    def _dispatched(self, assignment: Assignment, now: float) -> bool:
        """The core dispatched it. False (and nothing changes) unless it waits."""
        if self._state not in _WAITING:
            return False
        self._assignment = assignment
        self.queued_s = now - self.arrived_at
        self._move("dispatched")
        return True

    def _requeued(self) -> bool:
        """The core put it back in the queue. False unless it was at a backend."""
        if self._state != "dispatched" and self._state != "lost":
            return False
        self._assignment = None
        self._move("queued")
        return True

    def _reject(self, rejected: Rejected) -> None:
        """The core (or the engine) ended it with ``rejected``."""
        self._rejected = rejected
        self._assignment = None
        if self._book is None or not MOVES[self._state]:
            self._end_quietly(rejected)
        else:
            self._move("rejected", "rejected")

    def _end_quietly(self, rejected: Rejected) -> None:
        # Outside the book: refused before it was entered, or the book closes.
        self._rejected = rejected
        self._assignment = None
        self._state = "rejected"
        self._wake()

    def _move(self, new: State, outcome: str | None = None) -> None:
        old = self._state
        if new not in MOVES[old]:
            raise RuntimeError(f"request {self.request_id}: no move from {old} to {new}")
        self._state = new
        if self._book is not None:
            self._book._moved(self, old, new, outcome)
        self._wake()

    async def _wait_move(self) -> None:
        if self._wakeup is None:
            self._wakeup = trio.Event()
        await self._wakeup.wait()

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()


class AdmissionLike(Protocol):
    """What :func:`run_turn` and the job service use of an :class:`Admission`
    (fakes in tests provide the same)."""

    @property
    def request_id(self) -> str: ...

    @property
    def queued_s(self) -> float: ...

    @property
    def state(self) -> str: ...

    @property
    def assignment(self) -> Assignment | None: ...

    async def wait_dispatched(self) -> Assignment: ...

    async def wait_verdict(self) -> bool: ...

    def report(self, outcome: Outcome = "ok", detail: str = "") -> None: ...

    def cancel(self) -> None: ...


class UpstreamLost(Exception):
    """Raised by a turn's attempt: the upstream connection broke before anything
    reached the client. detail: what broke, for the core's log."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class ResponseCut(Exception):
    """Raised by a turn's attempt: the upstream connection broke after bytes went
    to the client, so the response is cut and nothing can be done."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


async def run_turn(
    admission: AdmissionLike,
    attempt: Callable[[Assignment], Awaitable[None]],
    *,
    on_requeued: Callable[[], Awaitable[None]] | None = None,
) -> Outcome:
    """Run a request's turn to its end and return the outcome it was reported
    with: ``ok`` (the backend answered, whatever its status) or ``error``.

    The loop: wait for the dispatch, ``await attempt(assignment)`` (send the
    request, pass the answer on), report. ``attempt`` returns normally when
    the backend's answer was passed on, raises :class:`UpstreamLost` when the
    connection broke before anything reached the client (reported
    ``upstream_lost``; the core's verdict decides whether the request is
    dispatched again or ends) or :class:`ResponseCut` when it broke later
    (reported ``error``).

    on_requeued: awaited after an ``upstream_lost`` report once the core put
    the request back in the queue (the job service records it on disk). Only
    then does the turn wait for the verdict before it waits for the dispatch.

    Raises :class:`~yard.errors.Rejected` when the request ends without being
    served (refused, deadline passed, backend failed, cancelled, yard shutting
    down). Anything else ``attempt`` raises propagates unreported: the caller
    cancels the admission.
    """
    while True:
        # Dispatched at once (inside submit) on an idle engine: go straight to
        # the backend, without a checkpoint.
        assignment = admission.assignment or await admission.wait_dispatched()
        try:
            await attempt(assignment)
        except UpstreamLost as lost:
            admission.report("upstream_lost", lost.detail)
            if on_requeued is not None and await admission.wait_verdict():
                await on_requeued()
            continue
        except ResponseCut as cut:
            admission.report("error", cut.detail)
            return "error"
        admission.report("ok")
        return "ok"
