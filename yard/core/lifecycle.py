"""The lifecycle of one backend, as a table.

Theory of operation
-------------------

A backend is a process the core asks the engine to start and stop. Its state
says what the core may do with it and what memory it holds:

- ``stopped``: no process. Holds no memory. May be started.
- ``starting``: StartBackend was decided; the process is loading. Holds its
  reservation (a first load, not yet measured, holds its devices alone).
- ``ready``: healthy; requests are dispatched to it while it has free slots.
- ``draining``: still healthy, but gets no new work: it was chosen to make
  room for a swap, or an operator asked to unload it. Once idle it is
  stopped; if the swap no longer needs it, it becomes ready again.
- ``stopping``: StopBackend was decided. Holds its memory until the engine
  reports ``BackendStopped`` (the memory is really free again).
- ``failed``: it exited on its own or never became ready. Holds no memory.
  Started again only when a request needs it, never in a loop.

Every legal move is one row of :data:`TRANSITIONS`: (state, event) -> state.
The scheduler asks :func:`can_move` before acting on an event from the outside
world (a late or duplicate report about a backend is ignored, not an error),
and calls :func:`move` for its own decisions: an illegal move there is a bug in
the core and raises :class:`IllegalTransition` naming the state and event.
"""

from __future__ import annotations

from enum import StrEnum


class BackendState(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    FAILED = "failed"


class Move(StrEnum):
    """What can happen to a backend."""

    START = "start"  # the core decided StartBackend
    READY = "ready"  # BackendReady
    START_FAILED = "start_failed"  # BackendStartFailed, or an exit while starting
    DRAIN = "drain"  # chosen for eviction / asked to unload while busy
    UNDRAIN = "undrain"  # the swap that wanted it no longer does
    STOP = "stop"  # the core decided StopBackend
    STOPPED = "stopped"  # BackendStopped
    EXITED = "exited"  # BackendExited


S = BackendState
M = Move

TRANSITIONS: dict[tuple[BackendState, Move], BackendState] = {
    (S.STOPPED, M.START): S.STARTING,
    (S.FAILED, M.START): S.STARTING,
    (S.STARTING, M.READY): S.READY,
    (S.STARTING, M.START_FAILED): S.FAILED,
    (S.STARTING, M.EXITED): S.FAILED,
    (S.READY, M.DRAIN): S.DRAINING,
    (S.READY, M.STOP): S.STOPPING,
    (S.READY, M.EXITED): S.FAILED,
    (S.DRAINING, M.UNDRAIN): S.READY,
    (S.DRAINING, M.STOP): S.STOPPING,
    (S.DRAINING, M.EXITED): S.FAILED,
    (S.STOPPING, M.STOPPED): S.STOPPED,
}
"""Every legal move. Anything else is illegal."""

OCCUPYING = frozenset({S.STARTING, S.READY, S.DRAINING, S.STOPPING})
"""States in which a backend holds memory on its devices."""

LOADED = frozenset({S.READY, S.DRAINING})
"""States in which a backend's process is healthy."""


class IllegalTransition(Exception):
    """The core tried a move its table does not allow (a bug in the core).

    An ``Exception``, not a ``RuntimeError``: mypyc compiles the core
    (:mod:`yard.compiled`) and a compiled class may derive from ``Exception``
    but not from most other built-in types."""

    def __init__(self, backend: str, state: BackendState, move: Move) -> None:
        super().__init__(f"backend {backend}: cannot {move.value!r} while {state.value!r}")
        self.backend = backend
        self.state = state
        self.move = move


def can_move(state: BackendState, move: Move) -> bool:
    """Whether ``move`` is legal in ``state``."""
    return (state, move) in TRANSITIONS


def move(backend: str, state: BackendState, move: Move) -> BackendState:
    """The state after ``move``; raises :class:`IllegalTransition` if illegal."""
    try:
        return TRANSITIONS[(state, move)]
    except KeyError:
        raise IllegalTransition(backend, state, move) from None
