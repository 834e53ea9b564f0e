"""The fake of :class:`yard.engine.Engine`: the one every test of what stands
above the engine uses (the job service, the data plane, observability, a
cluster node).

Theory of operation. The requests it is handed are the real
:class:`yard.admission.Admission`, entered in the real
:class:`yard.admission.AdmissionBook`: they move only along the real
:data:`yard.admission.MOVES`, a report or a cancel that the real engine would
drop is dropped here, and a waiter wakes exactly as it would. What the fake
leaves out is the scheduler core: by default the test plays it, moving each
request by hand (:meth:`FakeEngine.dispatch`, :meth:`~FakeEngine.reject`,
:meth:`~FakeEngine.requeue`, :meth:`~FakeEngine.shut_down`). Options make the
fake play a simple core instead:

- ``auto_dispatch``: each request is dispatched inside ``submit`` to its
  backend's URL (``base_urls``), as an idle real engine does, unless its
  backend is in ``hold`` (it then waits for the test's ``dispatch``);
- ``rejecting``: the core rejects every request for a backend on arrival (the
  admission comes back already rejected, as from a real engine whose core
  rejects at once: 507 ``does_not_fit``, 503 ``queue_full``, ...);
- ``lost``: the core's verdict after an ``upstream_lost`` report: ``"by_hand"``
  (the request waits in ``lost`` for the test), ``"fail"`` (502
  ``backend_failed``, what the real core says unless yard caused the crash),
  or ``"requeue_once"`` (a self-caused out-of-memory: back to its old place
  once, dispatched again if ``auto_dispatch``, failed the second time).

Two options imitate what the real engine does only in one case, made explicit
for tests that need it: ``refuse`` (``submit`` raises it; the real engine
raises only 429 ``app_queue_full``) and ``queue_time_s`` (every dispatch
reports that queue time, so a test on the real clock can assert it exactly).

The read side (:meth:`~FakeEngine.snapshot`, :meth:`~FakeEngine.explain`,
:meth:`~FakeEngine.statistics`, the decision log and its feeds) serves what the
test put in ``devices``, ``backends``, ``queue``, ``log``, ``logs`` and
``stats``, together with the requests that wait in it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import trio

from yard.admission import Admission, AdmissionBook, Assignment
from yard.core.decisions import Decision
from yard.core.events import Event, Outcome, RequestCancelled, RequestFinished
from yard.core.spec import DeviceKind, Profile
from yard.core.views import BackendView, DeviceView, QueuedView, Snapshot
from yard.engine import EngineStatistics, LoggedDecision
from yard.engine.records import shutting_down
from yard.errors import Rejected

__all__ = [
    "FakeAdmission",
    "FakeEngine",
    "GiB",
    "Submitted",
    "backend_view",
    "device_view",
    "profile",
    "queued_view",
    "statistics",
]

GiB = 2**30

Verdict = Literal["by_hand", "fail", "requeue_once"]


# -- views, as the core shows them ----------------------------------------------------


def backend_view(name: str, **changes: object) -> BackendView:
    """A stopped backend with one slot, changed by ``changes``."""
    view = BackendView(
        name=name,
        state="stopped",
        gpus=(),
        inflight=0,
        slots=1,
        served=0,
        loaded_at=None,
        pinned=False,
        profile=None,
        last_load_s=None,
        reason="not needed",
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def device_view(name: str = "gpu0", **changes: object) -> DeviceView:
    """An empty 24 GiB GPU with 1 GiB kept free, changed by ``changes``."""
    kind: DeviceKind = "host" if name == "host" else "gpu"
    view = DeviceView(
        name=name,
        kind=kind,
        total_bytes=24 * GiB,
        reserve_bytes=1 * GiB,
        committed_bytes=0,
        free_bytes=23 * GiB,
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def queued_view(request_id: str, backend: str, **changes: object) -> QueuedView:
    """A request waiting at the head of the queue, changed by ``changes``."""
    view = QueuedView(
        request_id=request_id,
        backend=backend,
        app="",
        priority=50.0,
        effective_priority=50.0,
        arrived_at=0.0,
        start_by=None,
        position=0,
        reason="waiting for its backend to load",
        estimated_start=None,
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def statistics(**changes: object) -> EngineStatistics:
    """The statistics of an engine that has done nothing, changed by ``changes``."""
    stats = EngineStatistics(
        requests={},
        submitted=0,
        loads=0,
        load_failures=0,
        stops=0,
        evictions=0,
        ooms=0,
        requeues=0,
        deadline_misses=0,
        rejects={},
        queue_length=0,
        inflight=0,
        backends_running=0,
        events=0,
        decisions=0,
    )
    return replace(stats, **changes)  # type: ignore[arg-type]


def profile(gpu_gib: float, host_gib: float, load_s: float) -> Profile:
    """A profile in GiB."""
    return Profile(gpu_bytes=int(gpu_gib * GiB), host_bytes=int(host_gib * GiB), load_s=load_s)


# -- requests -------------------------------------------------------------------------


class FakeAdmission(Admission):
    """The real :class:`~yard.admission.Admission`, plus what its holder told
    the engine: ``reports`` (each ``(outcome, detail)`` the engine was sent),
    ``cancelled``, how often it was dispatched, and the keywords it was
    submitted with (``submitted``)."""

    def __init__(
        self,
        *,
        submitted: dict[str, Any],
        arrived_at: float,
        send: Callable[[Event], None],
        book: AdmissionBook | None,
    ) -> None:
        super().__init__(
            request_id=submitted["request_id"],
            backend=submitted["backend"],
            arrived_at=arrived_at,
            send=send,
            book=book,
            app=submitted["app"],
        )
        self.submitted = submitted
        self.reports: list[tuple[Outcome, str]] = []
        self.cancelled = False
        self.dispatches = 0


@dataclass(frozen=True, slots=True)
class Submitted:
    """One call of :meth:`FakeEngine.submit` that the engine took: its
    keywords and the engine clock then."""

    kwargs: dict[str, Any]
    at: float


class FakeEngine:
    """The engine's surface over the real admissions, with the core played by
    the test (see the module notes for the options).

    base_urls: the backends it serves, each ready at its URL (shown ready in
        the snapshot). auto_dispatch: dispatch each request as it arrives.
    lost: the verdict after an ``upstream_lost`` report.
    queue_time_s: the queue time every dispatch reports (None: measured).
    offset: added to ``trio.current_time()`` for :meth:`now` (a fresh
        process's engine clock starts anywhere).
    refuse: ``submit`` raises it (nothing is entered).
    on_submit: called with the request id first thing in every ``submit``.
    aging_rate, estimated_wait_s: how :meth:`explain` ages a waiting request
        (points per second) and when it says the request starts (from now).
    """

    def __init__(
        self,
        base_urls: Mapping[str, str] | None = None,
        *,
        auto_dispatch: bool = False,
        lost: Verdict = "by_hand",
        queue_time_s: float | None = None,
        offset: float = 0.0,
        refuse: Rejected | None = None,
        on_submit: Callable[[str], None] | None = None,
        aging_rate: float = 1.0,
        estimated_wait_s: float = 10.0,
    ) -> None:
        self.base_urls = dict(base_urls or {})
        self.auto_dispatch = auto_dispatch
        self.lost: Verdict = lost
        self.queue_time_s = queue_time_s
        self.offset = offset
        self.refuse = refuse
        self.on_submit = on_submit
        self.aging_rate = aging_rate
        self.estimated_wait_s = estimated_wait_s
        # Backends whose requests wait for the test's dispatch (auto_dispatch).
        self.hold: set[str] = set()
        # Per backend: the core rejects every request for it on arrival.
        self.rejecting: dict[str, Rejected] = {}
        # What the read side serves, as the test sets it.
        self.devices: list[DeviceView] = [device_view("host", total_bytes=64 * GiB)]
        self.backends: dict[str, BackendView] = {
            name: backend_view(name, state="ready", reason="") for name in self.base_urls
        }
        self.queue: list[QueuedView] = []
        self.log: list[LoggedDecision] = []
        self.logs: dict[str, list[str]] = {}
        self.stats: EngineStatistics | None = None
        # What it was handed.
        self.submitted: list[Submitted] = []
        self.admissions: list[FakeAdmission] = []
        self.sent: list[Event] = []
        self._by_id: dict[str, FakeAdmission] = {}
        self._waiting: list[FakeAdmission] = []
        self._book = AdmissionBook()
        self._closed = False
        self._changed = trio.Event()
        self._subscribers: list[
            tuple[trio.MemorySendChannel[LoggedDecision], tuple[type[Decision], ...] | None]
        ] = []
        self._watchers: list[Callable[[float, Event | Decision], None]] = []

    # -- the engine's surface ---------------------------------------------------------

    def now(self) -> float:
        """The engine clock: trio's, moved by ``offset``."""
        return trio.current_time() + self.offset

    def submit(
        self,
        *,
        backend: str,
        priority: float,
        app: str = "",
        request_id: str | None = None,
        start_by: float | None = None,
        allow_late: bool = False,
        arrived_at: float | None = None,
        requeued: bool = False,
        not_before: float | None = None,
        window_label: str = "",
    ) -> FakeAdmission:
        """As :meth:`yard.engine.Engine.submit`. ``request_id`` is required
        here (the test names its requests)."""
        if request_id is None:
            raise AssertionError("the fake engine needs the request id its callers always give")
        if self.on_submit is not None:
            self.on_submit(request_id)
        if self.refuse is not None:
            raise self.refuse
        kwargs: dict[str, Any] = {
            "backend": backend,
            "priority": priority,
            "app": app,
            "request_id": request_id,
            "start_by": start_by,
            "allow_late": allow_late,
            "arrived_at": arrived_at,
            "requeued": requeued,
            "not_before": not_before,
            "window_label": window_label,
        }
        now = self.now()
        self.submitted.append(Submitted(kwargs=kwargs, at=now))
        admission = FakeAdmission(
            submitted=kwargs,
            arrived_at=now if arrived_at is None else arrived_at,
            send=self._hear,
            book=None if self._closed else self._book,
        )
        self.admissions.append(admission)
        self._by_id[request_id] = admission
        self._changed_now()
        if self._closed:
            admission._reject(shutting_down())
            return admission
        self._book.enter(admission)
        self._waiting.append(admission)
        rejected = self.rejecting.get(backend)
        if rejected is not None:
            self._end(admission, rejected)
        elif self.auto_dispatch and backend not in self.hold:
            self.dispatch(request_id)
        return admission

    def snapshot(self, limit: int = 200) -> Snapshot:
        """The devices, backends and queue the test set, and the requests
        waiting here after them."""
        queue = self._queued_views()
        return Snapshot(
            now=self.now(),
            devices=tuple(self.devices),
            backends=tuple(self.backends.values()),
            queue=tuple(queue[:limit]),
            queue_length=len(queue),
        )

    def explain(self, request_id: str) -> QueuedView | None:
        """A waiting request's place: one the test put in ``queue``, or one
        submitted here, aged ``aging_rate`` points per second, said to start
        ``estimated_wait_s`` from now."""
        return next((q for q in self._queued_views() if q.request_id == request_id), None)

    def decisions(self) -> list[LoggedDecision]:
        return list(self.log)

    def subscribe(
        self, kinds: tuple[type[Decision], ...] | None = None
    ) -> trio.MemoryReceiveChannel[LoggedDecision]:
        """A feed of the decisions :meth:`decide` makes from now on (16 may
        wait; a subscriber further behind is dropped, as the real engine drops
        it)."""
        send, receive = trio.open_memory_channel[LoggedDecision](16)
        self._subscribers.append((send, kinds))
        return receive

    def watch(self, watcher: Callable[[float, Event | Decision], None]) -> None:
        """Call ``watcher(at, item)`` with every event the engine is handed
        (sent, reported, cancelled) and every decision :meth:`decide` makes."""
        self._watchers.append(watcher)

    def statistics(self) -> EngineStatistics:
        """``stats`` if the test set it, else the counts of the requests
        handed here."""
        if self.stats is not None:
            return self.stats
        book = self._book
        return statistics(
            requests=dict(book.outcomes),
            submitted=len(self.submitted),
            queue_length=book.queued,
            inflight=book.inflight,
            events=len(self.sent),
            decisions=len(self.log),
            queued_by_app=dict(book.queued_by_app),
            inflight_by_app=dict(book.inflight_by_app),
        )

    def backend_log(self, backend: str) -> list[str]:
        return list(self.logs.get(backend, []))

    def send(self, event: Event) -> None:
        """An event for the core (admin events); kept in ``sent``."""
        self.sent.append(event)
        self._tell(event)

    # -- driven by the test: the core's decisions ------------------------------------------

    def admission(self, request_id: str) -> FakeAdmission:
        """The admission of a request submitted here (ended or not)."""
        return self._by_id[request_id]

    def dispatch(self, request_id: str, base_url: str | None = None) -> None:
        """The core dispatches a waiting request, to ``base_url`` (default:
        its backend's in ``base_urls``, else ``http://backend``)."""
        admission = self._by_id[request_id]
        backend = admission.backend
        url = base_url or self.base_urls.get(backend, "http://backend")
        assignment = Assignment(request_id=request_id, backend=backend, base_url=url)
        if not admission._dispatched(assignment, self.now()):
            raise AssertionError(f"{request_id} cannot be dispatched while {admission.state}")
        self._waiting.remove(admission)
        admission.dispatches += 1
        if self.queue_time_s is not None:
            admission.queued_s = self.queue_time_s

    def reject(self, request_id: str, code: str, status: int = 504, message: str = "") -> None:
        """The core ends a request with a refusal."""
        self._end(self._by_id[request_id], Rejected(status, code, message or code))

    def requeue(self, request_id: str) -> None:
        """The core puts a request reported lost back at the head of the queue."""
        admission = self._by_id[request_id]
        if admission.state != "lost" or not admission._requeued():
            raise AssertionError(f"{request_id} cannot be requeued while {admission.state}")
        self._waiting.insert(0, admission)

    def shut_down(self) -> None:
        """Yard stops: every live request ends with 503 ``shutting_down``, and
        so does every request submitted later."""
        self._closed = True
        self._waiting.clear()
        self._book.close(shutting_down())

    def decide(self, decision: Decision) -> LoggedDecision:
        """The core makes a decision now: logged, fed to the subscribers and
        watchers (it moves no request; use the methods above for that)."""
        logged = LoggedDecision(at=self.now(), decision=decision)
        self.log.append(logged)
        self._tell(decision)
        for entry in list(self._subscribers):
            channel, kinds = entry
            if kinds is not None and not isinstance(decision, kinds):
                continue
            try:
                channel.send_nowait(logged)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                channel.close()
                self._subscribers.remove(entry)
        return logged

    def set_backend(self, name: str, **changes: object) -> None:
        """Show backend ``name`` changed by ``changes`` (a stopped one if new)."""
        base = self.backends.get(name) or backend_view(name)
        self.backends[name] = replace(base, **changes)  # type: ignore[arg-type]

    # -- waits for the test -------------------------------------------------------------

    async def wait_submitted(self, count: int) -> None:
        """Wait until ``count`` requests were submitted."""
        while len(self.admissions) < count:
            await self._changed.wait()

    async def wait_settled(self, admission: FakeAdmission) -> None:
        """Wait until the admission was reported on or cancelled."""
        while not (admission.cancelled or admission.reports):
            await self._changed.wait()

    # -- inside ---------------------------------------------------------------------------

    def _hear(self, event: Event) -> None:
        # What an admission sends the core: its holder's report or cancel.
        if isinstance(event, RequestFinished):
            admission = self._by_id[event.request_id]
            admission.reports.append((event.outcome, event.detail))
            if admission.state == "lost":
                self._verdict(admission)
        elif isinstance(event, RequestCancelled):
            admission = self._by_id[event.request_id]
            admission.cancelled = True
            if admission in self._waiting:
                self._waiting.remove(admission)
        self._tell(event)
        self._changed_now()

    def _verdict(self, admission: FakeAdmission) -> None:
        if self.lost == "by_hand":
            return
        if self.lost == "requeue_once" and admission.dispatches < 2:
            self.requeue(admission.request_id)
            if self.auto_dispatch and admission.backend not in self.hold:
                self.dispatch(admission.request_id)
            return
        self._end(
            admission,
            Rejected(status=502, code="backend_failed", message="the backend failed"),
        )

    def _end(self, admission: FakeAdmission, rejected: Rejected) -> None:
        if admission in self._waiting:
            self._waiting.remove(admission)
        admission._reject(rejected)

    def _queued_views(self) -> list[QueuedView]:
        now = self.now()
        views = list(self.queue)
        for admission in self._waiting:
            kwargs = admission.submitted
            views.append(
                QueuedView(
                    request_id=admission.request_id,
                    backend=admission.backend,
                    app=admission.app,
                    priority=kwargs["priority"],
                    effective_priority=kwargs["priority"]
                    + self.aging_rate * (now - admission.arrived_at),
                    arrived_at=admission.arrived_at,
                    start_by=kwargs["start_by"],
                    position=len(views),
                    reason=f"waiting for {admission.backend} to load",
                    estimated_start=now + self.estimated_wait_s,
                )
            )
        return views

    def _tell(self, item: Event | Decision) -> None:
        now = self.now()
        for watcher in list(self._watchers):
            watcher(now, item)

    def _changed_now(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
