"""Read-only views of the scheduler for the dashboard, the jobs API and ``yard status``.

They are snapshots: plain frozen records built on request, never live objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from yard.core.spec import DeviceKind, Profile


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedView:
    """One waiting request.

    effective_priority: base + aging (+ the deadline boost once urgent), now.
    position: 0 = the next to be dispatched among the requests for its backend
        (snapshots list requests in dispatch order across backends).
    reason: why it still waits, for a person.
    estimated_start: engine-clock time it should start, if it can be guessed.
    """

    request_id: str
    backend: str
    app: str
    priority: float
    effective_priority: float
    arrived_at: float
    start_by: float | None
    position: int
    reason: str
    estimated_start: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendView:
    """One backend: its state (``stopped``, ``starting``, ``ready``, ``draining``,
    ``stopping``, ``failed``) and why it is in it."""

    name: str
    state: str
    gpus: tuple[str, ...]
    inflight: int
    slots: int
    served: int
    loaded_at: float | None
    pinned: bool
    profile: Profile | None
    last_load_s: float | None
    reason: str
    queued: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceView:
    """One memory pool.

    committed_bytes: reservations (profile x margin) of loaded and loading backends.
    live_bytes: the latest measured bytes per backend.
    foreign_bytes: used by processes yard does not own (latest reading).
    free_bytes: usable - max(committed, live) per backend - foreign, never negative.
    """

    name: str
    kind: DeviceKind
    total_bytes: int
    reserve_bytes: int
    committed_bytes: int
    live_bytes: dict[str, int] = field(default_factory=dict)
    foreign_bytes: int = 0
    free_bytes: int = 0
    exclusive: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """The whole scheduler at one moment. ``queue`` is in dispatch order and
    holds at most the ``limit`` asked for; ``queue_length`` counts them all."""

    now: float
    devices: tuple[DeviceView, ...]
    backends: tuple[BackendView, ...]
    queue: tuple[QueuedView, ...]
    queue_length: int
