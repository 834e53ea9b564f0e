"""Events: everything the core is told. Frozen records under one base.

The engine turns what happens in the world (an HTTP request came in, a process
became healthy, NVML reported memory) into these records and hands each to
``Scheduler.handle(event, now)``. The time of the event is the ``now``
argument, never a field, except where an event carries a time from the past
(a job restored after a restart keeps its original arrival).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from yard.core.spec import BackendSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event."""


# -- requests ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestArrived(Event):
    """A request (sync or a job) wants a backend.

    request_id: unique, chosen by the engine.
    backend: the backend that serves it.
    priority: base priority, already clamped to the app's maximum.
    app: who asked (for display and fairness reports).
    arrived_at: original arrival time, if earlier than ``now`` (a job restored
        after a restart, so that aging keeps counting). None: arrived now.
    start_by: latest time its work should start (engine clock), or None.
    allow_late: run it even when the deadline cannot be met / has passed.
    requeued: it was already requeued once after a self-caused OOM (restored
        jobs remember this), so it must never be requeued again.
    not_before: earliest time its work may start (engine clock), or None. Until
        then it is *held*: counted, never dispatched; from then on it waits like
        a request that arrived then (see :mod:`yard.core.windows`).
    window_label: how people read ``not_before`` ("13:50:00Z
        (X-Yard-Not-Before)"), for the reason a held request gives.
    """

    request_id: str
    backend: str
    priority: float
    app: str = ""
    arrived_at: float | None = None
    start_by: float | None = None
    allow_late: bool = False
    requeued: bool = False
    not_before: float | None = None
    window_label: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestCancelled(Event):
    """The client gave up (disconnect, DELETE of a job). Queued: it leaves the
    queue. Running: the engine has already cancelled the upstream call and the
    slot is free again."""

    request_id: str


Outcome = Literal["ok", "error", "upstream_lost"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFinished(Event):
    """A dispatched request is over.

    outcome:
      ``ok``: the backend answered (any HTTP status: a 4xx from the backend is
        the backend's answer, passed through, never retried).
      ``error``: it failed after bytes reached the client; nothing can be done.
      ``upstream_lost``: the connection to the backend broke before anything
        reached the client. The core waits (``lost_grace_s``) for the
        backend's exit report to tell whether yard caused it (OOM after
        over-commit: requeue once) or not (fail with ``backend_failed``).
    """

    request_id: str
    outcome: Outcome = "ok"
    detail: str = ""


# -- announcements ----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnouncementMade(Event):
    """An app says it will send ``count`` requests for ``backend`` inside the
    window ``[not_before, start_by)`` (engine clock); no bodies yet. The core
    loads the backend ahead and keeps it for the window (:mod:`yard.core.windows`).

    announcement_id: unique; a second arrival of the same id is ignored.
    priority: already clamped to the app's maximum.
    used: requests already matched to it (an announcement restored after a
        restart).
    label: how people read ``not_before`` ("13:50:00Z"), for reasons.
    """

    announcement_id: str
    app: str
    backend: str
    not_before: float
    start_by: float
    count: int
    priority: float
    used: int = 0
    label: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnouncementWithdrawn(Event):
    """The app withdrew an announcement; it ends ``withdrawn``."""

    announcement_id: str


# -- backends ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendReady(Event):
    """The backend's health check passed (and its warm-up, if any).

    context, slots: what the server itself reports it took (llama-server's
        ``/props``: ``n_ctx`` of a slot, ``total_slots``), where it tells;
        None: it does not (then what yard chose stands).
    """

    backend: str
    context: int | None = None
    slots: int | None = None

    def __post_init__(self) -> None:
        if (self.context is not None and self.context < 1) or (
            self.slots is not None and self.slots < 1
        ):
            raise ValueError("a server's context and slot count are positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendLoading(Event):
    """How far a load is, for people (e.g. ``"warm-up 40 % (3,277 of 8,192
    tokens, 51 s)"``): shown in the backend's reason and in the waiting
    reason of its requests until it is ready. Changes no decision."""

    backend: str
    progress: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendStartFailed(Event):
    """It exited or never became healthy within its start-up timeout. The
    engine has made sure the process is gone."""

    backend: str
    detail: str
    oom: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendExited(Event):
    """A ready backend exited without being asked to.

    exit_code: as the OS reported it; negative for a signal (-9: SIGKILL).
    oom: it shows signs of running out of memory (killed by the kernel's OOM
        killer, "out of memory" in its last log lines, CUDA OOM).
    """

    backend: str
    exit_code: int | None
    oom: bool = False
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendStopped(Event):
    """A stop the core decided is complete: the process group is gone and its
    memory is released on every device it used."""

    backend: str


# -- memory -----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileMeasured(Event):
    """A profile for a backend: from the store at start-up (``source="stored"``),
    from a first load measured alone (``"measured"``), or raised because live
    use went above it (``"raised"``). Figures are peaks, margin not applied."""

    backend: str
    gpu_bytes: int
    host_bytes: int
    load_s: float | None = None
    source: Literal["stored", "measured", "raised"] = "measured"
    context: int | None = None
    gpu_per_token: float | None = None
    host_per_token: float | None = None
    parallel: int | None = None
    gpu_per_slot: float | None = None
    host_per_slot: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryMeasured(Event):
    """One meter reading of one device.

    used_bytes: everything in use on the device right now.
    backends: bytes held on this device by each yard backend's process tree.
    Foreign use is ``used_bytes - sum(backends.values())``.
    by_delta: the meter fell back to device deltas here (it cannot tell the
        backends apart): from then on first loads on the device go alone, as
        on a device that never had per-process figures.
    """

    device: str
    used_bytes: int
    backends: tuple[tuple[str, int], ...] = ()
    by_delta: bool = False


# -- admin and time ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminLoad(Event):
    """An operator asked for a backend to be loaded now (if it fits)."""

    backend: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminUnload(Event):
    """An operator asked for a backend to be stopped once idle."""

    backend: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminPin(Event):
    """Pin (keep loaded, never evict) or unpin a backend."""

    backend: str
    pinned: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminForgetProfile(Event):
    """Forget a backend's profile; its next load is measured alone again."""

    backend: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendsChanged(Event):
    """The configuration changed (``yard reload``, a new file in the models
    folder): backends to add, to remove (they drain and stop), and to replace
    (they restart with the new spec once idle). See :mod:`yard.core.catalog`."""

    added: tuple[BackendSpec, ...] = ()
    removed: tuple[str, ...] = ()
    replaced: tuple[BackendSpec, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick(Event):
    """Time passed. The engine sends one at the core's ``next_wakeup()``."""
