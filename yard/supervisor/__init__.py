"""Real backend processes: the supervisor, by role.

:class:`Supervisor` is the real :class:`yard.ports.Launcher`: it starts each
backend in a process group of its own and stops it again, and never leaves
one behind. The rooms:

- :mod:`~yard.supervisor.launcher`: the :class:`Supervisor` (launch, stop all,
  hurry, orphans at start-up, statistics);
- :mod:`~yard.supervisor.process`: one running backend, :class:`ManagedProcess`
  (its logs, its exit and the signs of out-of-memory, its stop);
- :mod:`~yard.supervisor.readiness`: when a started backend is ready (health
  check, warm-up, context fill);
- :mod:`~yard.supervisor.groups`: process groups (members, signals, waiting
  until gone), on top of :mod:`yard.memory.procfs`;
- :mod:`~yard.supervisor.pidfiles`: pid files, and reaping the groups an
  earlier yard left running.
"""

from yard.supervisor.groups import group_members
from yard.supervisor.launcher import Supervisor, SupervisorStatistics
from yard.supervisor.pidfiles import Orphan
from yard.supervisor.process import OOM_SIGNS, ManagedProcess, looks_like_oom
from yard.supervisor.readiness import fills_context

__all__ = [
    "OOM_SIGNS",
    "ManagedProcess",
    "Orphan",
    "Supervisor",
    "SupervisorStatistics",
    "fills_context",
    "group_members",
    "looks_like_oom",
]
