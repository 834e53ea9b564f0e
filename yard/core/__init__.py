"""The scheduler core: events and the current time in, decisions out.

Rules this package keeps (a test enforces the first):

- It imports the standard library only, and nothing that does I/O: no trio,
  httpx, quart, ``time``, ``os``, ``random``, sockets, processes or files. The
  clock comes in as the ``now`` argument; there is no randomness.
- Same events at the same times give the same decisions, always.

Layout, from the outside in:

- ``spec`` (devices, backends, profiles, settings), ``events`` (what the core
  is told), ``decisions`` (what it asks for), ``views`` (read-only snapshots);
- ``scheduler``: ``Scheduler.handle`` and the pass that follows every event
  (plan loads, dispatch, settle);
- ``request_events`` and ``backend_events``: what each event changes;
- ``state`` (everything the scheduler knows, and the moves its parts share),
  ``records`` (a device's and a backend's live record), ``queue`` (the order of
  waiting requests), ``lifecycle`` (a backend's states, as a table),
  ``timers``;
- ``windows``: work ahead (held requests, announcements) and the loads done
  for it; ``early``: when such a load may come early;
- the policy's questions, as pure functions: ``placement`` (where a backend
  fits, what makes room, swap batching), ``victims`` (who may make room, in
  which order), ``instances`` (which instance of a backend a request goes
  to, what they share), ``estimates`` (load and service times, start
  costs), ``failures`` (was an out-of-memory yard's doing);
- ``reasons``: every sentence the core gives.

The wait bound is proved in ``docs/wait-bound.md``.
"""

from yard.core.decisions import (
    AnnouncementEnded,
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
    AnnouncementMade,
    AnnouncementWithdrawn,
    BackendExited,
    BackendLoading,
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
from yard.core.spec import HOST, BackendSpec, DeviceSpec, Prior, Profile, SchedulerConfig
from yard.core.views import BackendView, DeviceView, QueuedView, Snapshot

__all__ = [
    "HOST",
    "AdminForgetProfile",
    "AdminLoad",
    "AdminPin",
    "AdminUnload",
    "AnnouncementEnded",
    "AnnouncementMade",
    "AnnouncementWithdrawn",
    "BackendExited",
    "BackendLoading",
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
    "Prior",
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
