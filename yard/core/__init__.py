"""The scheduler core: events and the current time in, decisions out.

Rules this package keeps (a test enforces the first):

- It imports the standard library only, and nothing that does I/O: no trio,
  httpx, quart, ``time``, ``os``, ``random``, sockets, processes or files. The
  clock comes in as the ``now`` argument; there is no randomness.
- Same events at the same times give the same decisions, always.

Layout: ``spec`` (devices, backends, profiles, settings), ``events`` (what the
core is told), ``decisions`` (what it asks for), and the policy modules.
"""

from yard.core.decisions import (
    Decision,
    Dispatch,
    Flag,
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
from yard.core.spec import HOST, BackendSpec, DeviceSpec, Profile, SchedulerConfig

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
    "BackendStopped",
    "Decision",
    "DeviceSpec",
    "Dispatch",
    "Event",
    "Flag",
    "MemoryMeasured",
    "Profile",
    "ProfileMeasured",
    "Reject",
    "RequestArrived",
    "RequestCancelled",
    "RequestFinished",
    "Requeue",
    "SchedulerConfig",
    "StartBackend",
    "StopBackend",
    "Tick",
]
