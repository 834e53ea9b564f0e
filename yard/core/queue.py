"""Waiting requests of one backend, in the order they are dispatched.

Ordering rules (``docs/how-yard-decides.md``: "Who goes first", "Deadlines"):

- A request's *effective priority* is ``base + aging_rate * (now - aging_from)``,
  ``aging_from`` being its arrival (:func:`aging_start`: for *patient* work, a
  start-by far off, later). Linear aging never changes the order of two waiting
  requests, so each request gets a fixed *rank* ``base - aging_rate *
  aging_from`` at arrival (effective = rank + aging_rate * now) and heaps can
  hold the order.
- Patient work: a request whose start-by is further away than its patience
  (``patient_aging_s``) ages only from its *latest comfortable start*, that
  long before its start-by. Until then fresher work of higher priority goes first: a batch line
  due in three hours does not outrank a chat request that came a minute after
  it. Its start-by still holds (urgency, ``deadline_missed``), and its wait
  bound counts from its latest comfortable start (``docs/wait-bound.md``).
  Until then it also leaves free slots to other work that came to its backend
  lately (:func:`leaves_last_slot`): a chat request that comes finds a slot,
  not four batch lines.
- Urgent requests (a start-by deadline is near) are ordered among themselves
  earliest-deadline-first and count ``deadline_boost`` extra points.
- The next request is the urgent one with the earliest deadline *if* its
  boosted rank is at least the rank of every other waiting request; otherwise
  the request with the best boosted rank. Either way the request chosen, X,
  satisfies ``rank(X) + deadline_boost >= rank(R)`` for every waiting R. This
  is the inequality the wait bound rests on (see ``docs/wait-bound.md``).
- Ties: earlier arrival first, then request id.

Three heaps per backend: normal requests by rank, urgent ones by deadline and
urgent ones by rank; a fourth holds every request with a start-by, earliest
first, so that swap batching can ask how soon a swap is needed. Removals are
lazy: an entry is live only while its request is still queued, in the same heap
kind, with the same generation (a requeued request gets a new generation).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class ReqState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    LOST = "lost"  # upstream connection broke; waiting for the backend's exit report
    DONE = "done"
    HELD = "held"  # its not-before has not come; not in any queue yet


@dataclass(slots=True, eq=False)
class Req:
    """The core's record of one request."""

    id: str
    backend: str
    priority: float
    app: str
    arrived_at: float
    rank: float
    start_by: float | None
    allow_late: bool
    requeued: bool
    urgent_at: float | None = None
    state: ReqState = ReqState.QUEUED
    urgent: bool = False
    gen: int = 0
    overtakes: int = 0
    deadline_met: bool = False
    late_flagged: bool = False
    dispatched_at: float | None = None
    lost_at: float | None = None
    share_tag: float = 0.0  # start tag of the apps' fairness term (yard.core.fairness)
    ages_from: float | None = None  # patient work: its latest comfortable start (aging_start)
    # a window's stand-in near early: what its load evicts is idle and expected
    # to stay so until the window (yard.core.windows): its load is due at once
    early: bool = False

    def score(self, boost: float) -> float:
        """Boosted rank: the effective priority minus ``aging_rate * now``."""
        return self.rank + boost if self.urgent else self.rank

    def effective(self, now: float, rate: float, boost: float) -> float:
        return self.score(boost) + rate * now


def aging_start(arrived: float, start_by: float | None, patient_s: float) -> float:
    """When a request arriving (or released from its hold) at ``arrived`` starts
    to age: at once, or, for patient work, at its latest comfortable start
    ``start_by - patient_s`` (``SchedulerConfig.patient_aging_s``).

    The same lead for every request keeps the order of requests with the same
    start-by (a batch's lines of one model) their arrival order, so a batch is
    still served model by model, each loaded once.
    """
    if start_by is None:
        return arrived
    return max(arrived, start_by - patient_s)


OTHERS_RECENT_S = 60.0
"""A backend that other (not patient) work came to within this long keeps slots
free for it: such work is likely to come again soon."""


def leaves_last_slot(
    req: Req, queue: RequestQueue, running: Mapping[str, Req], slots: int, now: float
) -> bool:
    """Whether ``req``, next in its backend's order, must leave the free slots to
    other work for now. Only patient work (``now`` before its ``ages_from``) on a
    backend of several slots that other work came to lately
    (:data:`OTHERS_RECENT_S`) does: it may take a slot only if that leaves one
    free slot more than the other work running there holds, so a burst of the
    work that keeps coming finds slots free. A backend that serves patient work
    alone gives it every slot; on one of a single slot, order alone decides."""
    if (
        req.ages_from is None
        or now >= req.ages_from
        or slots < 2
        or now - queue.others_at > OTHERS_RECENT_S
    ):
        return False
    others = sum(1 for r in running.values() if r.ages_from is None)
    return slots - len(running) - 1 < others + 1


_NORMAL = 0
_URGENT = 1

_Entry = tuple[float, float, str, int, int, Req]


def order_key(req: Req, boost: float) -> tuple[float, float, str]:
    """Sort key across backends: best boosted rank, then arrival, then id."""
    return (-req.score(boost), req.arrived_at, req.id)


@dataclass(slots=True)
class RequestQueue:
    """The waiting requests of one backend."""

    boost: float
    size: int = 0
    _normal: list[_Entry] = field(default_factory=list)
    _edf: list[_Entry] = field(default_factory=list)
    _urank: list[_Entry] = field(default_factory=list)
    _head: Req | None = None
    _head_known: bool = False
    _deadlines: list[tuple[float, int, Req, int]] = field(default_factory=list)
    _pushed: int = 0
    others_at: float = -math.inf  # when the latest request that is not patient came
    # pushes and removals of requests with a start-by so far (the others do not
    # change start_bys)
    _deadline_changes: int = 0
    _start_bys: tuple[float, ...] = ()
    _start_bys_at: int = 0  # _deadline_changes when _start_bys was worked out
    _latest: float = math.inf  # start_by_latest's answer for _latest_key
    _latest_key: tuple[int, int, float, float] = (-1, 0, 0.0, 0.0)

    def push(self, req: Req) -> None:
        """Add a queued request (``req.state`` must be QUEUED)."""
        self.size += 1
        self._head_known = False
        if req.ages_from is None and req.arrived_at > self.others_at:
            self.others_at = req.arrived_at
        self._push(req)
        if req.start_by is not None:
            self._deadline_changes += 1
            self._pushed += 1
            heapq.heappush(self._deadlines, (req.start_by, self._pushed, req, req.gen))

    def start_bys(self) -> tuple[float, ...]:
        """The start-bys of the waiting requests that have one, earliest first."""
        if self._start_bys_at != self._deadline_changes:
            live = sorted(
                entry
                for entry in self._deadlines
                if entry[2].state is ReqState.QUEUED and entry[2].gen == entry[3]
            )
            self._deadlines = live  # a sorted list is a heap; the stale entries go
            self._start_bys = tuple(entry[0] for entry in live)
            self._start_bys_at = self._deadline_changes
        return self._start_bys

    def start_by_latest(self, slots: int, service_s: float, lead_s: float) -> float:
        """The latest time for a step of ``lead_s`` seconds (a load) after which
        ``slots`` slots serve the waiting requests with a start-by, earliest
        start-by first, each holding its slot ``service_s`` seconds, so that
        every one starts by its start-by (``inf``: none has one)."""
        key = (self._deadline_changes, slots, service_s, lead_s)
        if self._latest_key != key:
            start_bys = self.start_bys()
            self._latest = min(
                (
                    start_by - lead_s - (k // slots) * service_s
                    for k, start_by in enumerate(start_bys)
                ),
                default=math.inf,
            )
            self._latest_key = key
        return self._latest

    def _push(self, req: Req) -> None:
        if req.urgent:
            deadline = req.start_by if req.start_by is not None else float("inf")
            heapq.heappush(self._edf, (deadline, -req.rank, req.id, req.gen, _URGENT, req))
            heapq.heappush(self._urank, (-req.rank, req.arrived_at, req.id, req.gen, _URGENT, req))
        else:
            heapq.heappush(self._normal, (-req.rank, req.arrived_at, req.id, req.gen, _NORMAL, req))

    def make_urgent(self, req: Req) -> None:
        """Move a queued request into the urgent order."""
        if req.urgent:
            return
        req.urgent = True
        self._head_known = False
        self._push(req)

    def removed(self, req: Req) -> None:
        """Account for ``req`` leaving (its state or generation changes with it)."""
        self.size -= 1
        self._head_known = False
        if req.start_by is not None:
            self._deadline_changes += 1

    @staticmethod
    def _live(entry: _Entry) -> bool:
        req = entry[5]
        return (
            req.state is ReqState.QUEUED
            and req.gen == entry[3]
            and (entry[4] == _URGENT) == req.urgent
        )

    def _top(self, heap: list[_Entry]) -> Req | None:
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)
        return heap[0][5] if heap else None

    def head(self) -> Req | None:
        """The request to dispatch next, or None."""
        if not self._head_known:
            self._head = self._choose(
                self._top(self._normal), self._top(self._edf), self._top(self._urank)
            )
            self._head_known = True
        return self._head

    def _choose(self, n: Req | None, u: Req | None, m: Req | None) -> Req | None:
        if u is None or m is None:
            return n
        best_other = m.rank if n is None else max(n.rank, m.rank)
        if u.rank + self.boost >= best_other:
            return u
        if n is None:
            return m
        return n if order_key(n, self.boost) < order_key(m, self.boost) else m

    def ordered(self) -> list[Req]:
        """Every queued request in dispatch order (O(k log k), for views)."""
        normal = [e for e in self._normal if self._live(e)]
        edf = [e for e in self._edf if self._live(e)]
        urank = [e for e in self._urank if self._live(e)]
        heapq.heapify(normal)
        heapq.heapify(edf)
        heapq.heapify(urank)
        taken: set[str] = set()
        out: list[Req] = []

        def top(heap: list[_Entry]) -> Req | None:
            while heap and heap[0][5].id in taken:
                heapq.heappop(heap)
            return heap[0][5] if heap else None

        while True:
            req = self._choose(top(normal), top(edf), top(urank))
            if req is None:
                return out
            taken.add(req.id)
            out.append(req)
