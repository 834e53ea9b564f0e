"""The engine: the Trio loop that feeds the scheduler core and carries out its decisions.

Theory of operation
-------------------
Everything that happens in the world becomes an :class:`~yard.core.events.Event` and is
sent, without blocking, into ONE unbounded memory channel. One task (the loop) takes
events out in order, calls ``scheduler.handle(event, trio.current_time())`` and carries
out the returned decisions in order. Nobody else calls the scheduler's ``handle``, so
the core needs no locks and sees one totally ordered history (llama-swap's "one run
loop, no locks").

Carrying out a decision is either immediate (wake the :class:`Admission` of a request
that was dispatched, rejected or requeued) or a task (start or stop a backend process
through the :class:`~yard.ports.Launcher`). A task reports back by sending an event, so
its outcome reaches the core through the same channel.

Memory: a meter task reads every device every ``meter_interval_s`` and sends one
``MemoryMeasured`` per device. A first load the core asks to measure
(``StartBackend(measure=True)``) is also sampled every ``profile_interval_s`` from launch
to ready (warm-up included); its peak per device becomes ``ProfileMeasured("measured")``,
sent before ``BackendReady`` and persisted. Live use above the current profile sends
``ProfileMeasured("raised")`` and persists it too.

Shutdown: cancelling :meth:`Engine.run` stops every backend it started (shielded, within
``shutdown_grace_s``) and ends every waiting request with 503 ``shutting_down``.

Rules this module keeps:

- It reaches processes, meters and stores only through the ports (``yard.ports``); a
  port that raises fails that one start, stop or reading, never the engine.
- Sync callers (the HTTP layer, a job runner) never block on the engine: ``submit``,
  ``report`` and ``cancel`` are plain functions.
- Every request ends exactly once for its holder: dispatched and reported, rejected, or
  cancelled. A report that belongs to a dispatch the core has since taken back (a
  requeue after a self-caused out-of-memory) is dropped, never sent twice.
- It is cheap per event: no task and no cancel scope per request, only per backend.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

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
from yard.core.events import (
    BackendExited,
    BackendReady,
    BackendStartFailed,
    BackendStopped,
    Event,
    MemoryMeasured,
    ProfileMeasured,
    RequestArrived,
    RequestFinished,
    Tick,
)
from yard.core.spec import HOST, Profile
from yard.core.views import QueuedView, Snapshot
from yard.errors import Rejected
from yard.ports import (
    BackendLogs,
    BackendProcess,
    BackendStartError,
    DeviceReading,
    ExitStatus,
    Launcher,
    Meter,
    ProfileStore,
)

__all__ = [
    "Admission",
    "Assignment",
    "Engine",
    "EngineStatistics",
    "LoggedDecision",
    "Policy",
    "Rejected",
]

log = logging.getLogger("yard.engine")

# A core that keeps asking for a wake-up in the past would spin the loop; after one
# Tick at an instant, the next comes at least this much later.
_MIN_TICK_GAP_S = 1e-3
# The loop yields to other tasks at least this often while events keep coming.
_YIELD_EVERY = 32
# Bound on how long to wait for a stopped backend's memory to show as free.
_RELEASE_WAIT_S = 10.0


class Policy(Protocol):
    """What the engine needs from a scheduler. :class:`yard.core.Scheduler` is one; the
    simulator's baseline policies (``sim.baselines``) are others, driven by the same
    engine so that comparisons differ only in the policy."""

    def handle(self, event: Event, now: float) -> list[Decision]: ...

    def next_wakeup(self) -> float | None: ...

    def snapshot(self, now: float, limit: int = 200) -> Snapshot: ...

    def explain(self, request_id: str, now: float) -> QueuedView | None: ...

    def profile(self, backend: str) -> Profile | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggedDecision:
    """A decision and the engine time it was made at."""

    at: float
    decision: Decision


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStatistics:
    """A snapshot of the engine's counters and gauges (for ``/metrics`` and the
    dashboard).

    requests: requests ended, by outcome: ``ok``, ``error`` (reported by the holder),
        ``rejected`` (by the core), ``cancelled`` (by the client).
    submitted: requests handed to :meth:`Engine.submit`.
    loads: backend starts ordered; load_failures: starts that never became ready.
    stops: backend stops ordered; evictions: stops ordered while requests waited
        (a stop to make room, as opposed to an idle timeout or an operator's unload).
    ooms: backends that died or failed to start with signs of out-of-memory.
    requeues: requests put back in the queue after a self-caused out-of-memory.
    deadline_misses: requests ended with ``deadline_missed``.
    rejects: rejections by error code.
    queue_length: requests waiting (queued, or between a lost upstream and the core's
        verdict); inflight: requests dispatched and not yet reported.
    backends_running: backend processes the engine holds (starting, ready, stopping).
    events, decisions: how many the loop has handled and carried out.
    queued_by_app, inflight_by_app: queue_length and inflight by app (apps with
        none left out).
    refusals: requests refused or ended unserved, by app, then by code: the
        core's rejections and the engine's own ``app_queue_full``.
    """

    requests: Mapping[str, int]
    submitted: int
    loads: int
    load_failures: int
    stops: int
    evictions: int
    ooms: int
    requeues: int
    deadline_misses: int
    rejects: Mapping[str, int]
    queue_length: int
    inflight: int
    backends_running: int
    events: int
    decisions: int
    queued_by_app: Mapping[str, int] = field(default_factory=dict)
    inflight_by_app: Mapping[str, int] = field(default_factory=dict)
    refusals: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


class _Backend:
    """The engine's record of one backend process it started."""

    __slots__ = (
        "gpus",
        "launched_at",
        "measure",
        "name",
        "peaks",
        "process",
        "ready",
        "scope",
        "stop_requested",
    )

    def __init__(self, name: str, gpus: tuple[str, ...], measure: bool) -> None:
        self.name = name
        self.gpus = gpus
        self.measure = measure
        self.process: BackendProcess | None = None
        self.stop_requested = False
        self.ready = False
        self.scope: trio.CancelScope | None = None
        self.launched_at = 0.0
        # Peak bytes per device while a first load is being measured.
        self.peaks: dict[str, int] = {}


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
        self._launcher = launcher
        self._meter = meter
        self._profiles = profiles
        self._logs = logs
        self._start_timeout_s = start_timeout_s
        self._meter_interval_s = meter_interval_s
        self._profile_interval_s = profile_interval_s
        self._shutdown_grace_s = shutdown_grace_s
        self._subscriber_buffer = subscriber_buffer
        # None is no event: it wakes the loop to work out its next wake-up again.
        self._send, self._receive = trio.open_memory_channel[Event | None](math.inf)
        self._log: deque[LoggedDecision] = deque(maxlen=log_size)
        # Each live feed with the decision types it takes (None: all).
        self._subscribers: list[
            tuple[trio.MemorySendChannel[LoggedDecision], tuple[type[Decision], ...] | None]
        ] = []
        # The requests it holds; their moves keep its counts.
        self._book = AdmissionBook()
        self._backends: dict[str, _Backend] = {}
        self._raised: dict[str, tuple[int, int]] = {}
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
        self._load_failures = 0
        self._stops = 0
        self._evictions = 0
        self._ooms = 0
        self._requeues = 0
        self._events = 0
        self._decisions = 0
        self._meter_failures = 0
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
    ) -> Admission:
        """Hand a request to the scheduler and return its :class:`Admission`.

        Times are on the engine clock. ``arrived_at`` is for requests that arrived
        before now (a job restored after a restart); ``requeued`` for one that was
        already requeued once. Never blocks. After shutdown the admission is already
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
            admission._reject(_shutting_down())
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

    def statistics(self) -> EngineStatistics:
        """Counters and gauges, as a frozen record."""
        return EngineStatistics(
            requests=dict(self._book.outcomes),
            submitted=self._submitted,
            loads=self._loads,
            load_failures=self._load_failures,
            stops=self._stops,
            evictions=self._evictions,
            ooms=self._ooms,
            requeues=self._requeues,
            deadline_misses=self._rejects.get("deadline_missed", 0),
            rejects=dict(self._rejects),
            queue_length=self._book.queued,
            inflight=self._book.inflight,
            backends_running=len(self._backends),
            events=self._events,
            decisions=self._decisions,
            queued_by_app=dict(self._book.queued_by_app),
            inflight_by_app=dict(self._book.inflight_by_app),
            refusals={app: dict(codes) for app, codes in self._refusals.items()},
        )

    def backend_log(self, backend: str) -> list[str]:
        """The last log lines of the backend, from the ``logs`` it was given
        (empty without)."""
        return self._logs.backend_log(backend) if self._logs is not None else []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled.

        Loads the stored profiles of every backend the scheduler knows, starts the
        meter, then reports ready. On cancellation it stops every backend it started
        (shielded, within ``shutdown_grace_s``) and ends every waiting request with
        503 ``shutting_down``.
        """
        if self._started:
            raise RuntimeError("an Engine runs once")
        self._started = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._load_stored_profiles()
                if self._meter is not None:
                    nursery.start_soon(self._meter_loop)
                task_status.started()
                await self._loop()
        finally:
            self._closed = True
            with trio.CancelScope(shield=True) as cleanup:
                cleanup.deadline = trio.current_time() + self._shutdown_grace_s
                await self._stop_everything()
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
        record = self._backends.get(decision.backend)
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
        log.warning("profile raised: %s", decision.reason)
        if decision.backend is not None:
            self._raised[decision.backend] = (
                decision.profile.gpu_bytes,
                decision.profile.host_bytes,
            )
            self._nursery_start(self._store_profile, decision.backend, decision.profile)

    def _apply_start(self, decision: StartBackend, now: float) -> None:
        if decision.backend in self._backends:
            log.error("core started %s, which is already running; ignored", decision.backend)
            return
        assert self._nursery is not None
        self._loads += 1
        record = _Backend(decision.backend, decision.gpus, decision.measure)
        self._backends[decision.backend] = record
        self._nursery.start_soon(self._run_backend, record)

    def _apply_stop(self, decision: StopBackend, now: float) -> None:
        self._stops += 1
        if self._book.queued > 0:
            self._evictions += 1
        record = self._backends.get(decision.backend)
        if record is None:
            log.error("core stopped %s, which is not running", decision.backend)
            self._send_event(BackendStopped(backend=decision.backend))
            return
        if record.stop_requested:
            return
        record.stop_requested = True
        if record.scope is not None:
            record.scope.cancel()

    # -- backend processes -------------------------------------------------------

    async def _run_backend(self, record: _Backend) -> None:
        """One backend's life: launch, wait ready, watch for exit, stop on request."""
        name = record.name
        record.launched_at = trio.current_time()
        try:
            process = await self._launcher.launch(name, record.gpus, measure=record.measure)
        except BackendStartError as exc:
            self._backends.pop(name, None)
            self._started_failed(record, exc.detail, exc.oom)
            return
        except Exception as exc:
            # A launcher bug or an OS error must fail this start, not the engine.
            log.exception("launching %s failed", name)
            self._backends.pop(name, None)
            self._started_failed(record, f"could not start {name}: {exc!r}", False)
            return
        record.process = process
        failure: tuple[str, bool] | None = None
        if not record.stop_requested:
            async with trio.open_nursery() as sampling:
                if record.measure and self._meter is not None:
                    sampling.start_soon(self._sample_first_load, record)
                with trio.CancelScope() as record.scope:
                    if record.stop_requested:
                        record.scope.cancel()
                    try:
                        with trio.fail_after(self._start_timeout_s(name)):
                            await process.wait_ready()
                    except BackendStartError as exc:
                        failure = (exc.detail, exc.oom)
                    except trio.TooSlowError:
                        timeout = self._start_timeout_s(name)
                        failure = (f"{name} did not become ready within {timeout:g} s", False)
                    except Exception as exc:
                        log.exception("waiting for %s to become ready failed", name)
                        failure = (f"{name} failed its start-up check: {exc!r}", False)
                record.scope = None
                sampling.cancel_scope.cancel()
        if record.stop_requested:
            await self._stop_process(record)
            return
        if failure is not None:
            # The process may still be alive (a hang); make sure it is gone.
            status = await self._stop_quietly(process)
            self._backends.pop(name, None)
            self._started_failed(record, failure[0], failure[1] or status.oom)
            return
        record.ready = True
        measured = self._finish_measurement(record) if record.measure else None
        self._send_event(BackendReady(backend=name))
        if measured is not None:
            self._nursery_start(self._store_profile, name, measured)
        with trio.CancelScope() as record.scope:
            if record.stop_requested:
                record.scope.cancel()
            status = await process.wait_exit()
            if not record.stop_requested:
                self._backends.pop(name, None)
                if status.oom:
                    self._ooms += 1
                self._send_event(
                    BackendExited(
                        backend=name, exit_code=status.code, oom=status.oom, detail=status.detail
                    )
                )
                return
        record.scope = None
        await self._stop_process(record)

    def _nursery_start(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    def _started_failed(self, record: _Backend, detail: str, oom: bool) -> None:
        self._load_failures += 1
        if oom:
            self._ooms += 1
        if record.stop_requested:
            self._send_event(BackendStopped(backend=record.name))
        else:
            self._send_event(BackendStartFailed(backend=record.name, detail=detail, oom=oom))

    async def _stop_quietly(self, process: BackendProcess) -> ExitStatus:
        """Stop a process; a failure to stop is logged, and the core is told it is
        gone anyway (otherwise it would wait for that memory forever)."""
        try:
            return await process.stop()
        except Exception as exc:
            log.exception("stopping %s failed", process.name)
            return ExitStatus(code=None, detail=f"stop failed: {exc!r}")

    async def _stop_process(self, record: _Backend) -> None:
        process = record.process
        if process is not None:
            await self._stop_quietly(process)
            await self._wait_memory_released(record)
        self._backends.pop(record.name, None)
        self._send_event(BackendStopped(backend=record.name))

    async def _wait_memory_released(self, record: _Backend) -> None:
        """After a stop, wait (bounded) until the meter no longer sees the backend's
        memory, so that the next load on its devices starts from what is really free."""
        if self._meter is None or record.process is None or record.process.pid is None:
            return
        pids = {record.name: record.process.pid}
        with trio.move_on_after(_RELEASE_WAIT_S):
            while True:
                readings = await self._read_meter(pids)
                if not any(reading.backends.get(record.name, 0) for reading in readings):
                    return
                await trio.sleep(self._profile_interval_s)

    # -- memory ------------------------------------------------------------------

    def _pids(self) -> dict[str, int]:
        pids: dict[str, int] = {}
        for name, record in self._backends.items():
            if record.process is not None and record.process.pid is not None:
                pids[name] = record.process.pid
        return pids

    async def _read_meter(self, pids: Mapping[str, int]) -> list[DeviceReading]:
        """Read the meter; a failed read (a driver hiccup) is logged and yields
        nothing, so that memory trouble never takes the engine down."""
        assert self._meter is not None
        try:
            return await self._meter.read(pids)
        except Exception:
            self._meter_failures += 1
            if self._meter_failures == 1 or self._meter_failures % 100 == 0:
                log.exception("reading memory failed (%d times so far)", self._meter_failures)
            return []

    async def _sample_first_load(self, record: _Backend) -> None:
        assert self._meter is not None
        while True:
            readings = await self._read_meter(self._pids())
            _track_peaks(record, readings)
            await trio.sleep(self._profile_interval_s)

    def _finish_measurement(self, record: _Backend) -> Profile:
        """Turn the peaks seen during a first load into a profile and tell the core."""
        load_s = trio.current_time() - record.launched_at
        gpu = max((b for d, b in record.peaks.items() if d != HOST), default=0)
        profile = Profile(gpu_bytes=gpu, host_bytes=record.peaks.get(HOST, 0), load_s=load_s)
        record.measure = False
        self._raised.pop(record.name, None)
        self._send_event(
            ProfileMeasured(
                backend=record.name,
                gpu_bytes=profile.gpu_bytes,
                host_bytes=profile.host_bytes,
                load_s=profile.load_s,
                source="measured",
            )
        )
        return profile

    async def _store_profile(self, backend: str, profile: Profile) -> None:
        if self._profiles is None:
            return
        try:
            await self._profiles.put(backend, profile)
        except Exception:
            # Persisting is best effort: the core already has the figure.
            log.exception("could not store the profile of %s", backend)

    async def _load_stored_profiles(self) -> None:
        if self._profiles is None:
            return
        now = trio.current_time()
        for view in self._scheduler.snapshot(now, 0).backends:
            profile = await self._profiles.get(view.name)
            if profile is not None:
                self._handle(
                    ProfileMeasured(
                        backend=view.name,
                        gpu_bytes=profile.gpu_bytes,
                        host_bytes=profile.host_bytes,
                        load_s=profile.load_s,
                        source="stored",
                    )
                )

    async def _meter_loop(self) -> None:
        while True:
            readings = await self._read_meter(self._pids())
            self._take_readings(readings)
            await trio.sleep(self._meter_interval_s)

    def _take_readings(self, readings: list[DeviceReading]) -> None:
        live: dict[str, tuple[int, int]] = {}
        for reading in readings:
            self._send_event(
                MemoryMeasured(
                    device=reading.device,
                    used_bytes=reading.used_bytes,
                    backends=tuple(sorted(reading.backends.items())),
                )
            )
            host = reading.device == HOST
            for name, used in reading.backends.items():
                gpu_bytes, host_bytes = live.get(name, (0, 0))
                if host:
                    live[name] = (gpu_bytes, max(host_bytes, used))
                else:
                    live[name] = (max(gpu_bytes, used), host_bytes)
        for name, (gpu_bytes, host_bytes) in live.items():
            record = self._backends.get(name)
            if record is None:
                continue
            if record.measure:
                _track_peaks(record, readings)
                continue
            profile = self._scheduler.profile(name)
            if profile is None:
                continue
            known_gpu, known_host = self._raised.get(name, (0, 0))
            known_gpu = max(known_gpu, profile.gpu_bytes)
            known_host = max(known_host, profile.host_bytes)
            if gpu_bytes <= known_gpu and host_bytes <= known_host:
                continue
            raised = Profile(
                gpu_bytes=max(gpu_bytes, known_gpu),
                host_bytes=max(host_bytes, known_host),
                load_s=profile.load_s,
            )
            self._raised[name] = (raised.gpu_bytes, raised.host_bytes)
            self._send_event(
                ProfileMeasured(
                    backend=name,
                    gpu_bytes=raised.gpu_bytes,
                    host_bytes=raised.host_bytes,
                    load_s=raised.load_s,
                    source="raised",
                )
            )
            self._nursery_start(self._store_profile, name, raised)

    # -- shutdown ------------------------------------------------------------------

    async def _stop_everything(self) -> None:
        processes = [r.process for r in self._backends.values() if r.process is not None]
        async with trio.open_nursery() as nursery:
            for process in processes:
                nursery.start_soon(self._stop_quietly, process)
        self._backends.clear()

    def _end_everything(self) -> None:
        self._book.close(_shutting_down())
        for subscriber, _ in self._subscribers:
            subscriber.close()
        self._subscribers.clear()
        self._send.close()


def _track_peaks(record: _Backend, readings: list[DeviceReading]) -> None:
    peaks = record.peaks
    for reading in readings:
        used = reading.backends.get(record.name)
        if used is not None and used > peaks.get(reading.device, 0):
            peaks[reading.device] = used


def _shutting_down() -> Rejected:
    return Rejected(
        status=503,
        code="shutting_down",
        message="yard is shutting down; try again once it is back",
        retry_after_s=5.0,
    )
