"""The scheduler core: events and the current time in, decisions out.

Rules this package keeps (a test enforces the first):

- It imports the standard library only, and nothing that does I/O: no trio,
  httpx, quart, ``time``, ``os``, ``random``, sockets, processes or files. The
  clock comes in as the ``now`` argument; there is no randomness.
- Same events at the same times give the same decisions, always.

Layout: ``spec`` (devices, backends, profiles, settings), ``events`` (what the
core is told), ``decisions`` (what it asks for), ``scheduler`` (the policy:
order, memory fit, eviction, failures; the wait bound is proved in its
docstring), ``queue`` (the order of waiting requests), ``lifecycle`` (a
backend's states, as a table) and ``views`` (read-only snapshots).
"""

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
    AdminForgetProfile,
    AdminLoad,
    AdminPin,
    AdminUnload,
    BackendExited,
    BackendReady,
    BackendStartFailed,
    BackendStopped,
    Event,
    MemoryMeasured,
    ProfileMeasured,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    Tick,
)
from yard.core.lifecycle import BackendState, IllegalTransition
from yard.core.scheduler import Scheduler
from yard.core.spec import HOST, BackendSpec, DeviceSpec, Profile, SchedulerConfig
from yard.core.views import BackendView, DeviceView, QueuedView, Snapshot

__all__ = [
    "HOST",
    "AdminForgetProfile",
    "AdminLoad",
    "AdminPin",
    "AdminUnload",
    "BackendExited",
    "BackendReady",
    "BackendSpec",
    "BackendStartFailed",
    "BackendState",
    "BackendStopped",
    "BackendView",
    "Decision",
    "DeviceSpec",
    "DeviceView",
    "Dispatch",
    "Event",
    "Flag",
    "IllegalTransition",
    "MemoryMeasured",
    "Profile",
    "ProfileMeasured",
    "ProfileRaised",
    "QueuedView",
    "Reject",
    "RequestArrived",
    "RequestCancelled",
    "RequestFinished",
    "Requeue",
    "Scheduler",
    "SchedulerConfig",
    "Snapshot",
    "StartBackend",
    "StopBackend",
    "Tick",
]
