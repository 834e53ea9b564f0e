"""What the core is told about the machine and the backends, and what it learns.

These records are static facts (devices, backends, scheduler settings) and the
measured profile of a backend. They are plain data: the configuration loader
builds them from TOML, the simulator builds them from a scenario, and the core
never reads a file or the clock to get them.

Units: memory in bytes, time in seconds on the engine's clock (a monotonic
number of seconds; the core never asks what the wall-clock time is),
priorities in "priority points" (higher goes first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

HOST = "host"
"""The name of the host-RAM device. Every backend holds some host memory."""

DeviceKind = Literal["gpu", "host"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSpec:
    """One memory pool the core places backends into.

    name: ``"gpu0"``, ``"gpu1"``, ... or :data:`HOST`.
    kind: ``"gpu"`` or ``"host"``.
    total_bytes: the capacity of the pool.
    reserve_bytes: kept free at all times (for the driver, the desktop, spikes).
    exclusive: at most one backend at a time on this device (LocalAI's
        "single active backend"), whatever the memory would allow.
    per_process: the meter tells each backend's memory here apart (host
        ``/proc``, NVML's per-process lists, DRM fdinfo, Apple footprints), so a
        backend's first load is measured next to the others. False (NVML's
        device-delta fallback, or unknown): a first load goes alone, since the
        device's growth is then all the meter can credit it with.
    """

    name: str
    kind: DeviceKind
    total_bytes: int
    reserve_bytes: int = 0
    exclusive: bool = False
    per_process: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a device needs a name")
        if self.total_bytes < 0 or self.reserve_bytes < 0:
            raise ValueError(f"device {self.name}: memory sizes cannot be negative")
        if self.kind == "host" and self.name != HOST:
            raise ValueError(f"the host device must be called {HOST!r}, not {self.name!r}")

    @property
    def usable_bytes(self) -> int:
        """Capacity minus the reserve: what backends and foreign users may fill."""
        return max(0, self.total_bytes - self.reserve_bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendSpec:
    """One model server the core may start, feed and stop.

    name: unique; requests name the backend they need (the HTTP layer maps the
        ``model`` an app sends to the backend serving it).
    gpus: the GPUs this backend may be placed on (empty: host memory only).
    gpu_count: how many of ``gpus`` one running instance occupies (usually 1).
    slots: how many requests it serves at once.
    idle_ttl_s: stop it after this long without work (None: keep it until the
        memory is needed).
    pinned: always loaded; never evicted to make room.
    context: the context sizes it may be started with (min, max), or None;
        each start gets the largest that fits (:mod:`yard.core.resources`).
    parallel: the slot counts it may be started with (min, max), or None; a
        running instance serves as many requests at once as it got (then
        ``slots`` is only the estimate for an instance not started yet).
    instances: how many processes of this server the core may run at once
        (LiteLLM's deployments behind one model name), each a backend of its own:
        the first has the configured name, the others are named by
        :func:`instance_name` (``news-llm@2``) and set ``instance_of``. Every
        instance carries the same count. Requests for the first are routed among
        them (:mod:`yard.core.instances`); they share one profile.
    instance_of: the first instance's name, on the others (None on the first).
    instance_load_penalty: this backend's own
        :attr:`SchedulerConfig.instance_load_penalty` (None: the scheduler's);
        every instance carries the same.
    prior: what its model file says it needs (None: nothing known), used
        until its first measurement (:class:`Prior`).
    spread_windows: with several instances, whether held work and
        announcements ready the further instances ahead of their windows too,
        where the work announced is more than the first's slots
        (:func:`yard.core.instances.spread`); False: windows ready the first
        instance, and a further one loads when a request finds those loaded
        busy. Every instance carries the same.
    """

    name: str
    gpus: tuple[str, ...] = ()
    gpu_count: int = 1
    slots: int = 1
    idle_ttl_s: float | None = None
    pinned: bool = False
    context: tuple[int, int] | None = None
    parallel: tuple[int, int] | None = None
    instances: int = 1
    instance_of: str | None = None
    instance_load_penalty: float | None = None
    spread_windows: bool = False
    prior: Prior | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a backend needs a name")
        if self.instance_load_penalty is not None:
            _check_load_penalty(self.instance_load_penalty, f"backend {self.name}: ")
        if not 1 <= self.instances <= MAX_INSTANCES:
            raise ValueError(f"backend {self.name}: instances must be 1 to {MAX_INSTANCES}")
        if self.instance_of is not None and not (
            2 <= (instance_number(self.name, self.instance_of) or 0) <= self.instances
        ):
            raise ValueError(
                f"backend {self.name}: instance N of {self.instance_of} is named "
                f"{self.instance_of}{INSTANCE_SEPARATOR}N, 2 <= N <= instances ({self.instances})"
            )
        if self.context is not None and not 1 <= self.context[0] <= self.context[1]:
            raise ValueError(f"backend {self.name}: context needs 1 <= min <= max")
        if self.parallel is not None and not 1 <= self.parallel[0] <= self.parallel[1]:
            raise ValueError(f"backend {self.name}: parallel needs 1 <= min <= max")
        if self.slots < 1:
            raise ValueError(f"backend {self.name}: slots must be at least 1")
        if self.gpus and not 1 <= self.gpu_count <= len(self.gpus):
            raise ValueError(
                f"backend {self.name}: gpu_count {self.gpu_count} must be between 1 and "
                f"the {len(self.gpus)} GPUs it may use"
            )
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"backend {self.name}: a GPU is listed twice")

    @property
    def uses_gpu(self) -> bool:
        return bool(self.gpus)


MAX_INSTANCES = 8
"""The most instances one backend may declare."""

INSTANCE_LOAD_PENALTY = 0.25
"""The default :attr:`SchedulerConfig.instance_load_penalty`. Measured on the
2-GPU announced radio day (four seeds): without a penalty, seed 1 loaded
news-llm@2 four times at night, once to save 4 s of a 44 s wait, each time
evicting music that loaded again after it (14 loads, lower bound 11); with a
quarter, 12 loads against 10, and every high-priority p95 still at most half
the best baseline's."""

MAX_INSTANCE_LOAD_PENALTY = 4.0
"""The largest penalty accepted: at 4 a further instance must save four times
its start, so it is loaded only for a queue far longer than a load; to load none
for queues at all, keep ``instances = 1``."""


def _check_load_penalty(value: float, where: str) -> None:
    if not 0 <= value <= MAX_INSTANCE_LOAD_PENALTY:
        raise ValueError(
            f"{where}instance_load_penalty must be between 0 and "
            f"{MAX_INSTANCE_LOAD_PENALTY:g} (the fraction of a further instance's start "
            f"counted against loading it), got {value}"
        )


INSTANCE_SEPARATOR = "@"
"""Between a backend's name and an instance number (``news-llm@2``, as systemd
names the instances of a unit); never part of a configured name, so an
instance's name cannot clash with another backend's."""


def instance_name(first: str, number: int) -> str:
    """The name of instance ``number`` (1-based) of backend ``first``: ``first``
    itself for 1, ``first@N`` after."""
    return first if number == 1 else f"{first}{INSTANCE_SEPARATOR}{number}"


def first_instance(name: str) -> str:
    """The first instance's name (the configured backend's) for any instance's
    ``name``: ``news-llm`` for ``news-llm@2`` and for ``news-llm`` itself."""
    return name.partition(INSTANCE_SEPARATOR)[0]


def instance_number(name: str, first: str) -> int | None:
    """N if ``name`` is ``first@N`` (N >= 2, no leading zeros); 1 if it is
    ``first``; else None."""
    if name == first:
        return 1
    prefix = first + INSTANCE_SEPARATOR
    digits = name[len(prefix) :]
    if not name.startswith(prefix) or not digits.isdigit() or digits != str(int(digits)):
        return None
    return int(digits) if int(digits) >= 2 else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """What one backend was measured to need.

    gpu_bytes: peak memory on each GPU it occupies (0 for host-only backends).
    host_bytes: peak anonymous + shared resident host memory of its process tree.
    load_s: measured time from start to ready (warm-up included).
    context: the context size the figures were measured at (None: the backend
        declares no context range).
    gpu_per_token, host_per_token: bytes each token of context adds, learned
        from two points (None: not learned yet); see :mod:`yard.core.resources`.
    parallel: the slot count the figures were measured at (None: the backend
        declares no parallel range).
    gpu_per_slot, host_per_slot: bytes each slot adds, learned from two points
        at one context (None: not learned yet).
    """

    gpu_bytes: int
    host_bytes: int
    load_s: float
    context: int | None = None
    gpu_per_token: float | None = None
    host_per_token: float | None = None
    parallel: int | None = None
    gpu_per_slot: float | None = None
    host_per_slot: float | None = None

    def __post_init__(self) -> None:
        if self.gpu_bytes < 0 or self.host_bytes < 0 or self.load_s < 0:
            raise ValueError("a profile cannot hold negative figures")


@dataclass(frozen=True, slots=True, kw_only=True)
class Prior:
    """What a backend's model file says it needs, before it was ever measured
    (:mod:`yard.memory.prior` reads it). The core places a backend with no
    profile by it, as by a measured profile, until the first measurement
    replaces it.

    profile: the estimate, in a profile's shape: figures at ``profile.context``
        and bytes per token of context (no load time: ``load_s`` is 0 and
        unused). Margin not applied.
    trained_context: the context the model was trained for (None: unknown);
        no start is offered a larger one.
    source: what it was read from, for reasons ("the model file").
    """

    profile: Profile
    trained_context: int | None = None
    source: str = "the model file"

    def __post_init__(self) -> None:
        if self.trained_context is not None and self.trained_context < 1:
            raise ValueError("a trained context must be positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """The knobs of the policy. Defaults are what ``yard serve`` uses.

    aging_rate: priority points a waiting request gains per second.
    min_priority, max_priority: the range apps may ask for (the wait bound
        depends on its width).
    deadline_boost: priority points an urgent deadline request gains. Bounded,
        so that deadlines cannot starve anybody (see the wait bound).
    share_points: the most priority points the apps' weights take from one
        request (:mod:`yard.core.fairness`; only when some app has a weight).
        Bounded, like the boost: it widens the wait bound by
        ``share_points / aging_rate`` seconds.
    urgency_window_s: a deadline request becomes urgent this long before its
        latest start (deadline minus the expected time to start it).
    batch_bound: how many times a request at the head of the queue may be
        overtaken by requests for an already-loaded backend while its own
        swap waits ("swap batching"). 0 turns batching off.
    queue_limit: most requests waiting at once; more are refused (503).
    profile_margin: factor applied to measured peaks to get a reservation.
    default_load_s: assumed load time for a backend never measured.
    default_service_s: assumed service time before one was measured.
    lost_grace_s: how long a request whose upstream connection broke waits for
        the backend's exit report before it fails as ``backend_failed``.
    lead_margin_s: a backend is loaded this long more than its measured load
        time before announced or held work's window opens.
    patient_aging_s: a request whose start-by is further away than this ages
        only from this long before its start-by: work that says it can wait gives
        way to fresher work of higher priority until then, and still starts by
        its start-by (:func:`yard.core.queue.aging_start`).
    max_announcements: most announcements an app may have open at once
        (``POST /v1/announcements``; ``[apps.NAME] max_announcements`` overrides
        it). Read by the announcement service, not by the core.
    instance_load_penalty: for a backend with several instances, the fraction
        of a further instance's start (load, plus making room) counted on top of
        the wait when a request is routed to it while it is not loaded
        (:mod:`yard.core.instances`): such an instance is chosen only when it
        saves more than this much of its start, since a load takes the GPU and
        usually evicts a backend that comes back. 0 to 4;
        ``BackendSpec.instance_load_penalty`` overrides it per backend.
    """

    aging_rate: float = 1.0
    min_priority: float = 0.0
    max_priority: float = 100.0
    deadline_boost: float = 200.0
    share_points: float = 20.0
    urgency_window_s: float = 30.0
    batch_bound: int = 4
    queue_limit: int = 10_000
    profile_margin: float = 1.10
    default_load_s: float = 30.0
    default_service_s: float = 10.0
    lost_grace_s: float = 5.0
    lead_margin_s: float = 2.0
    patient_aging_s: float = 3600.0
    max_announcements: int = 16
    instance_load_penalty: float = INSTANCE_LOAD_PENALTY

    def __post_init__(self) -> None:
        _check_load_penalty(self.instance_load_penalty, "")
        if self.aging_rate <= 0:
            raise ValueError("aging_rate must be positive, or requests could wait forever")
        if self.max_priority < self.min_priority:
            raise ValueError("max_priority must not be below min_priority")
        if self.deadline_boost < 0 or self.batch_bound < 0 or self.queue_limit < 1:
            raise ValueError("deadline_boost and batch_bound >= 0, queue_limit >= 1")
        if self.lead_margin_s < 0 or self.max_announcements < 0:
            raise ValueError("lead_margin_s and max_announcements must not be negative")
        if self.share_points < 0:
            raise ValueError("share_points must not be negative")
        if not self.patient_aging_s > 0:
            raise ValueError("patient_aging_s must be positive")
