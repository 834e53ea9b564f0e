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
sent before ``BackendReady`` and persisted. Live use above the current profile is the
core's to judge: it raises the profile and says so with ``ProfileRaised``, which the
engine persists.

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

Modules: ``loop`` (the :class:`Engine`: its public surface, the loop, the decisions
about requests), ``backends`` (starting, running and stopping backend processes),
``metering`` (the meter, first-load measurements, profiles), ``records`` (the
:class:`Policy` it drives, its reports, its record of a backend).
"""

from yard.admission import Admission, Assignment
from yard.engine.loop import Engine
from yard.engine.records import EngineStatistics, LoggedDecision, Policy

__all__ = [
    "Admission",
    "Assignment",
    "Engine",
    "EngineStatistics",
    "LoggedDecision",
    "Policy",
]
