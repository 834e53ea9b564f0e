"""The engine's loop and its public surface: :class:`Engine`.

One task takes events in order, hands each to the policy and carries out the
decisions it returns: requests' admissions here, backend processes through
:mod:`yard.engine.backends`, memory and profiles through :mod:`yard.engine.metering`.
The theory of operation is in :mod:`yard.engine`.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import deque
from collections.abc import Callable, Collection, Mapping
from typing import Any

import trio

from yard.admission import Admission, AdmissionBook, Assignment
from yard.core.decisions import (
    Decision,
    Dispatch,
    Flag,
    ProfileRaised,
    Reject,
    Requeue,
    StartBackend,
    StopBackend,
)
from yard.core.events import Event, RequestArrived, RequestFinished, Tick
from yard.core.views import QueuedView, Snapshot
from yard.engine.backends import Backends
from yard.engine.metering import Metering
from yard.engine.records import (
    BackendRecord,
    EngineStatistics,
    LoggedDecision,
    Policy,
    shutting_down,
)
from yard.errors import Rejected
from yard.ports import BackendLogs, Launcher, Meter, ProfileStore

log = logging.getLogger("yard.engine")

# A core that keeps asking for a wake-up in the past would spin the loop; after one
# Tick at an instant, the next comes at least this much later.
_MIN_TICK_GAP_S = 1e-3
# The loop yields to other tasks at least this often while events keep coming.
_YIELD_EVERY = 32
# How long the engine waits for the meter's first reading before it serves.
_FIRST_READING_S = 10.0


class Engine:
    """Feeds one scheduler with events and carries out its decisions.

    scheduler: the core (:class:`yard.core.Scheduler`) or another :class:`Policy`.
    launcher: starts backend processes. meter: reads memory (None: no measurements,
        e.g. in unit tests). profiles: durable profiles (None: nothing persisted).
    logs: what the backends wrote, for :meth:`backend_log` (None: nothing kept).
    start_timeout_s: per backend, how long start-up plus warm-up may take.
    meter_interval_s: how often the meter is read while serving.
    profile_interval_s: how often it is read during a measured first load.
    log_size: how many recent decisions :meth:`decisions` keeps.
    shutdown_grace_s: on shutdown, how long stopping the backends may take.
    subscriber_buffer: decisions a live subscriber may fall behind before it is dropped.
    max_queued: per app, the most of its requests that may wait at once
        (``[apps.NAME] max_queued``); :meth:`submit` refuses one more. Apps not
        in it have no limit of their own.

    Start it with ``await nursery.start(engine.run)``; it is ready for
    :meth:`submit` once that returns, and serves until cancelled.
    """

    def __init__(
        self,
        *,
        scheduler: Policy,
        launcher: Launcher,
        meter: Meter | None = None,
        profiles: ProfileStore | None = None,
        logs: BackendLogs | None = None,
        start_timeout_s: Callable[[str], float] = lambda backend: 600.0,
        meter_interval_s: float = 1.0,
        profile_interval_s: float = 0.2,
        log_size: int = 1000,
        shutdown_grace_s: float = 30.0,
        subscriber_buffer: int = 1000,
        max_queued: Mapping[str, int] | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._max_queued = dict(max_queued or {})
        # Per app with a max_queued: a moving mean of its requests' queue wait,
        # for the Retry-After of a refusal.
        self._app_wait_s: dict[str, float] = {}
        self._refusals: dict[str, dict[str, int]] = {}
        self._logs = logs
        self._shutdown_grace_s = shutdown_grace_s
        self._subscriber_buffer = subscriber_buffer
        # None is no event: it wakes the loop to work out its next wake-up again.
        self._send, self._receive = trio.open_memory_channel[Event | None](math.inf)
        self._log: deque[LoggedDecision] = deque(maxlen=log_size)
        self._raised_this_load: set[str | None] = set()
        # Each live feed with the decision types it takes (None: all).
        self._subscribers: list[
            tuple[trio.MemorySendChannel[LoggedDecision], tuple[type[Decision], ...] | None]
        ] = []
        # Called with every event handled and every decision made (see watch()).
        self._watchers: list[Callable[[float, Event | Decision], None]] = []
        # The requests it holds; their moves keep its counts.
        self._book = AdmissionBook()
        # The backend processes it started, by name (kept by self._backends).
        self._records: dict[str, BackendRecord] = {}
        records = self._records
        self._metering = Metering(
            policy=scheduler,
            meter=meter,
            profiles=profiles,
            records=records,
            send_event=self._send_event,
            spawn=self._nursery_start,
            meter_interval_s=meter_interval_s,
            profile_interval_s=profile_interval_s,
        )
        self._backends = Backends(
            records=records,
            launcher=launcher,
            metering=self._metering,
            send_event=self._send_event,
            spawn=self._nursery_start,
            start_timeout_s=start_timeout_s,
            warmup=self._warmup,
        )
        self._nursery: trio.Nursery | None = None
        self._started = False
        self._closed = False
        self._last_tick = -math.inf
        # While the loop waits for an event: until when (None: no wake-up due).
        self._waiting_until: float | None = None
        self._handling = False
        # Counters and gauges for statistics().
        self._submitted = 0
        self._rejects: dict[str, int] = {}
        self._loads = 0
        self._stops = 0
        self._evictions = 0
        self._requeues = 0
        self._events = 0
        self._decisions = 0
        self._apply_by_type: dict[type[Decision], Callable[[Any, float], None]] = {
            Dispatch: self._apply_dispatch,
            Reject: self._apply_reject,
            Requeue: self._apply_requeue,
            StartBackend: self._apply_start,
            StopBackend: self._apply_stop,
            Flag: self._apply_flag,
            ProfileRaised: self._apply_profile_raised,
        }

    # -- the public surface ------------------------------------------------------

    def now(self) -> float:
        """The engine clock (``trio.current_time()``)."""
        return trio.current_time()

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
    ) -> Admission:
        """Hand a request to the scheduler and return its :class:`Admission`.

        Times are on the engine clock. ``arrived_at`` is for requests that arrived
        before now (a job restored after a restart); ``requeued`` for one that was
        already requeued once. ``not_before``: the work must not start before then
        (held until its window opens; ``window_label`` is how people read it, for
        the reason it waits). Never blocks. After shutdown the admission is already
        rejected (503, ``shutting_down``).

        Raises :class:`Rejected` (429 ``app_queue_full``, with a Retry-After) when
        ``app`` already has its ``max_queued`` requests waiting; nothing is
        entered then. A restored request (``arrived_at`` given) was admitted
        before, so it is counted but never refused.
        """
        limit = self._max_queued.get(app)
        if limit is not None and arrived_at is None and not self._closed:
            waiting = self._book.queued_by_app.get(app, 0)
            if waiting >= limit:
                raise self._queue_full(app, waiting, limit)
        if request_id is None:
            request_id = uuid.uuid4().hex
        now = trio.current_time()
        admission = Admission(
            request_id=request_id,
            backend=backend,
            arrived_at=now if arrived_at is None else arrived_at,
            send=self._send_event,
            book=None if self._closed else self._book,
            app=app,
        )
        self._submitted += 1
        if self._closed:
            admission._reject(shutting_down())
            return admission
        self._book.enter(admission)
        event = RequestArrived(
            request_id=request_id,
            backend=backend,
            priority=priority,
            app=app,
            arrived_at=arrived_at,
            start_by=start_by,
            allow_late=allow_late,
            requeued=requeued,
            not_before=not_before,
            window_label=window_label,
        )
        self._deliver(event, now)
        return admission

    def _queue_full(self, app: str, waiting: int, limit: int) -> Rejected:
        self._refused(app, "app_queue_full")
        # A place frees when one of the app's requests starts: with ``waiting``
        # of them waiting about W each, one starts every W / waiting seconds
        # (Little's law). 1 s before any of them has started.
        mean_wait = self._app_wait_s.get(app)
        retry = 1.0 if mean_wait is None else min(60.0, max(1.0, mean_wait / max(1, waiting)))
        return Rejected(
            status=429,
            code="app_queue_full",
            message=f"app {app!r} already has {waiting} requests waiting, the most "
            f"[apps.{app}] max_queued = {limit} allows; try again after Retry-After "
            "seconds, once some of them have started",
            retry_after_s=retry,
        )

    def _refused(self, app: str, code: str) -> None:
        counts = self._refusals.setdefault(app, {})
        counts[code] = counts.get(code, 0) + 1

    def send(self, event: Event) -> None:
        """Send an event to the core (admin events: AdminLoad, AdminPin, ...)."""
        self._send_event(event)

    async def load_stored_profiles(self, backends: Collection[str]) -> None:
        """Send the core the stored profile of each of ``backends`` that has
        one (backends ``yard reload`` added, after the BackendsChanged that
        added them)."""
        await self._metering.load_stored_profiles(self.send, only=backends)

    def snapshot(self, limit: int = 200) -> Snapshot:
        """The core's view of devices, backends and the queue, now."""
        return self._scheduler.snapshot(trio.current_time(), limit)

    def explain(self, request_id: str) -> QueuedView | None:
        """A queued request's place and the reason it waits (None if not queued)."""
        return self._scheduler.explain(request_id, trio.current_time())

    def decisions(self) -> list[LoggedDecision]:
        """The most recent decisions (up to ``log_size``), oldest first."""
        return list(self._log)

    def subscribe(
        self, kinds: tuple[type[Decision], ...] | None = None
    ) -> trio.MemoryReceiveChannel[LoggedDecision]:
        """A live feed of decisions from now on: those that are instances of one
        of ``kinds`` (None: all of them), so that a subscriber that wants a few
        kinds is not sent, say, a dispatch for every request. A subscriber that
        falls more than ``subscriber_buffer`` decisions behind is dropped (its
        channel ends); the engine never waits for anybody."""
        send, receive = trio.open_memory_channel[LoggedDecision](self._subscriber_buffer)
        self._subscribers.append((send, kinds))
        return receive

    def watch(self, watcher: Callable[[float, Event | Decision], None]) -> None:
        """Call ``watcher(at, item)`` with every event the engine hands the core
        and every decision it makes, in the engine's order, at the moment it
        happens (engine time). It runs inside the engine's loop, so it must be
        quick, must not block and must not raise: one that raises is logged
        and dropped. For recorders that need exact times without a task of
        their own (the dashboard's timeline); it changes nothing."""
        self._watchers.append(watcher)

    def _tell(self, at: float, item: Event | Decision) -> None:
        for watcher in list(self._watchers):
            try:
                watcher(at, item)
            except Exception:
                log.exception("a watcher of the engine failed; it is dropped")
                self._watchers.remove(watcher)

    def statistics(self) -> EngineStatistics:
        """Counters and gauges, as a frozen record."""
        return EngineStatistics(
            requests=dict(self._book.outcomes),
            submitted=self._submitted,
            loads=self._loads,
            load_failures=self._backends.load_failures,
            stops=self._stops,
            evictions=self._evictions,
            ooms=self._backends.ooms,
            requeues=self._requeues,
            deadline_misses=self._rejects.get("deadline_missed", 0),
            rejects=dict(self._rejects),
            queue_length=self._book.queued,
            inflight=self._book.inflight,
            backends_running=len(self._records),
            events=self._events,
            decisions=self._decisions,
            queued_by_app=dict(self._book.queued_by_app),
            inflight_by_app=dict(self._book.inflight_by_app),
            refusals={app: dict(codes) for app, codes in self._refusals.items()},
        )

    def _warmup(self, backend: str) -> str | None:
        """The latest warm-up progress the supervisor noted in the backend's
        log (``[yard] warm-up 40 % (...)``), or None."""
        for line in reversed(self.backend_log(backend)[-20:]):
            if line.startswith("[yard] warm-up "):
                return line.removeprefix("[yard] ")
        return None

    def backend_log(self, backend: str) -> list[str]:
        """The last log lines of the backend, from the ``logs`` it was given
        (empty without)."""
        return self._logs.backend_log(backend) if self._logs is not None else []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled.

        Loads the stored profiles of every backend the scheduler knows, takes the
        meter's first reading (the foreign use of every device), starts the meter,
        then reports ready. On cancellation it stops every backend it started
        (shielded, within ``shutdown_grace_s``) and ends every waiting request with
        503 ``shutting_down``.
        """
        if self._started:
            raise RuntimeError("an Engine runs once")
        self._started = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._metering.load_stored_profiles(self._handle)
                if self._metering.meter is not None:
                    # The first reading before serving: a request that comes at
                    # once is placed beside what already uses the card, not on
                    # a card taken for empty. A driver that hangs is not waited
                    # for long; the readings every interval follow either way.
                    with trio.move_on_after(_FIRST_READING_S):
                        await self._metering.read_once()
                    nursery.start_soon(self._metering.run)
                task_status.started()
                await self._loop()
        finally:
            self._closed = True
            with trio.CancelScope(shield=True) as cleanup:
                cleanup.deadline = trio.current_time() + self._shutdown_grace_s
                await self._backends.stop_everything()
            self._end_everything()

    # -- the loop ------------------------------------------------------------------

    async def _loop(self) -> None:
        receive = self._receive
        next_wakeup = self._scheduler.next_wakeup
        unyielded = 0
        while True:
            wake = next_wakeup()
            if wake is not None:
                wake = max(wake, self._last_tick + _MIN_TICK_GAP_S)
                if wake <= trio.current_time():
                    await trio.lowlevel.checkpoint()
                    self._tick()
                    continue
            try:
                # Events already waiting are taken without a cancel scope each (the
                # common case under load); a yield every few keeps the loop fair.
                event = receive.receive_nowait()
            except trio.WouldBlock:
                unyielded = 0
                self._waiting_until = wake
                if wake is None:
                    event = await receive.receive()
                else:
                    with trio.move_on_at(wake):
                        event = await receive.receive()
                        if event is not None:
                            self._handle(event)
                        continue
                    self._tick()
                    continue
            else:
                unyielded += 1
                if unyielded >= _YIELD_EVERY:
                    unyielded = 0
                    await trio.lowlevel.checkpoint()
            if event is not None:
                self._handle(event)

    def _tick(self) -> None:
        self._last_tick = trio.current_time()
        self._handle(Tick())

    def _handle(self, event: Event) -> None:
        now = trio.current_time()
        self._events += 1
        self._handling = True
        if self._watchers:
            self._tell(now, event)
        try:
            decisions = self._scheduler.handle(event, now)
            if decisions:
                apply = self._apply_by_type
                for decision in decisions:
                    self._record(decision, now)
                    handler = apply.get(type(decision))
                    if handler is None:
                        handler = self._handler_for(type(decision))
                    handler(decision, now)
        finally:
            self._handling = False

    def _handler_for(self, kind: type[Decision]) -> Callable[[Any, float], None]:
        """A decision type the table does not name: use its nearest known base
        (a new kind of Flag is still a Flag)."""
        for base in kind.__mro__[1:]:
            handler = self._apply_by_type.get(base)
            if handler is not None:
                self._apply_by_type[kind] = handler
                return handler
        raise TypeError(f"the engine cannot carry out {kind.__name__}")

    def _record(self, decision: Decision, now: float) -> None:
        self._decisions += 1
        logged = LoggedDecision(at=now, decision=decision)
        self._log.append(logged)
        if self._watchers:
            self._tell(now, decision)
        if self._subscribers:
            for entry in list(self._subscribers):
                subscriber, kinds = entry
                if kinds is not None and not isinstance(decision, kinds):
                    continue
                try:
                    subscriber.send_nowait(logged)
                except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                    self._subscribers.remove(entry)
                    subscriber.close()

    def _send_event(self, event: Event) -> None:
        if self._closed:
            return
        self._deliver(event, trio.current_time())

    def _deliver(self, event: Event, now: float) -> None:
        """Hand ``event`` to the core: at once when the loop is idle, else
        through the loop's channel.

        Idle means no event is queued or on its way to the loop (a send takes
        it off the waiters, and so does its wake-up or cancellation) and its
        wake-up is not yet due, so handling the event here keeps the order of
        events and saves a task switch: a request's arrival, its end and a
        cancel are handled in the task that reports them, before that task's
        next write (so a client's next request does not meet this one's
        bookkeeping). Never from inside a decision being applied: an event
        sent then waits for the loop.
        """
        waiting_until = self._waiting_until
        if (
            not self._handling
            and self._receive.statistics().tasks_waiting_receive
            and (waiting_until is None or now < waiting_until)
        ):
            self._handle(event)
            wake = self._scheduler.next_wakeup()
            if wake is not None and (
                waiting_until is None
                or max(wake, self._last_tick + _MIN_TICK_GAP_S) < waiting_until
            ):
                # It needs a Tick sooner than the loop is waiting for.
                self._send.send_nowait(None)
        else:
            self._send.send_nowait(event)

    # -- decisions -------------------------------------------------------------------

    def _apply_dispatch(self, decision: Dispatch, now: float) -> None:
        admission = self._book.get(decision.request_id)
        if admission is None:
            # Cancelled while the core was deciding; its RequestCancelled is on the way.
            return
        record = self._records.get(decision.backend)
        if record is None or record.process is None or not record.ready:
            # A core bug; fail this request loudly rather than send it nowhere.
            log.error(
                "core dispatched %s to %s, which is not ready; failing the request",
                decision.request_id,
                decision.backend,
            )
            admission._reject(
                Rejected(
                    status=502,
                    code="backend_failed",
                    message=f"backend {decision.backend} was not ready",
                )
            )
            self._send_event(
                RequestFinished(
                    request_id=decision.request_id,
                    outcome="error",
                    detail=f"backend {decision.backend} was not ready",
                )
            )
            return
        assignment = Assignment(
            request_id=decision.request_id,
            backend=decision.backend,
            base_url=record.process.base_url,
        )
        if admission._dispatched(assignment, now) and admission.app in self._max_queued:
            mean = self._app_wait_s.get(admission.app)
            waited = admission.queued_s
            self._app_wait_s[admission.app] = (
                waited if mean is None else mean + 0.2 * (waited - mean)
            )

    def _apply_reject(self, decision: Reject, now: float) -> None:
        self._rejects[decision.code] = self._rejects.get(decision.code, 0) + 1
        admission = self._book.get(decision.request_id)
        if admission is None:
            return
        self._refused(admission.app, decision.code)
        admission._reject(
            Rejected(
                status=decision.status,
                code=decision.code,
                message=decision.message,
                retry_after_s=decision.retry_after_s,
            )
        )

    def _apply_requeue(self, decision: Requeue, now: float) -> None:
        self._requeues += 1
        admission = self._book.get(decision.request_id)
        if admission is not None:
            admission._requeued()

    def _apply_flag(self, decision: Flag, now: float) -> None:
        log.info("flag: %s", decision.reason)

    def _apply_profile_raised(self, decision: ProfileRaised, now: float) -> None:
        # One line per backend and load at INFO (a raise is yard learning, not
        # a fault); the decision log keeps every one.
        first = decision.backend not in self._raised_this_load
        if decision.backend is not None:
            self._raised_this_load.add(decision.backend)
        log.log(logging.INFO if first else logging.DEBUG, "profile raised: %s", decision.reason)
        if decision.backend is not None:
            self._metering.raised(decision.backend, decision.profile)

    def _apply_start(self, decision: StartBackend, now: float) -> None:
        self._raised_this_load.discard(decision.backend)
        if self._backends.start(decision, self._nursery):
            self._loads += 1

    def _apply_stop(self, decision: StopBackend, now: float) -> None:
        self._stops += 1
        if self._book.queued > 0:
            self._evictions += 1
        self._backends.stop(decision.backend)

    # -- shutdown ------------------------------------------------------------------

    def _nursery_start(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    def _end_everything(self) -> None:
        self._book.close(shutting_down())
        for subscriber, _ in self._subscribers:
            subscriber.close()
        self._subscribers.clear()
        self._send.close()
