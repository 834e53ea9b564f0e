"""The core's live records of devices and backends (mutable, owned by the scheduler).

The scheduler changes them only in its event handlers and its pass; placement,
estimates and views read them. Nothing outside :mod:`yard.core` sees them: the
views turn them into frozen records.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from yard.core.lifecycle import BackendState
from yard.core.queue import Req, RequestQueue, order_key
from yard.core.spec import HOST, BackendSpec, DeviceSpec, Profile

ARRIVAL_MEMORY_S = 600.0
"""The time constant of a backend's decayed arrival count (:attr:`Backend.heat`):
an arrival counts ``exp(-age / ARRIVAL_MEMORY_S)``, so the count over this time is
its recent arrival rate."""
ARRIVAL_GAPS = 32
"""How many recent gaps between a backend's arrivals it keeps (:attr:`Backend.gaps`)."""
SERVICE_WINDOW = 64
"""How many recent service times the high estimate is the maximum of."""


@dataclass(slots=True, eq=False)
class Device:
    """One memory pool: its spec and the latest meter reading."""

    spec: DeviceSpec
    used: int | None = None
    foreign: int = 0

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(slots=True)
class Loan:
    """The room of a stopped backend, lent to ``borrower``'s load for a request
    of ``app``, an app ahead of its share (:mod:`yard.core.lending`)."""

    borrower: str
    app: str
    wished: bool = False  # the core set the victim's want_load to give it back


@dataclass(slots=True, eq=False)
class Backend:
    """One backend: its lifecycle state, its current instance, what it learned."""

    spec: BackendSpec
    name: str  # spec.name, kept at hand: it is read on every planning round
    queue: RequestQueue
    pinned: bool
    # the first instance's name where its backend has several (None: one), so
    # that a sibling is told apart from any other backend in planning
    family: str | None = None
    state: BackendState = BackendState.STOPPED
    reason: str = "never started"
    # why it waits for a load, or the reason of the plan told to it (by name):
    # a sentence made when it is read (see wait_reason)
    waiting_why: str | Callable[[str], str] = ""
    running: dict[str, Req] = field(default_factory=dict)
    # placement of the current instance
    gpus: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    reserved: dict[str, int] = field(default_factory=dict)
    live: dict[str, int] = field(default_factory=dict)
    measuring: bool = False
    loading: str = ""  # how far its load is (BackendLoading), while starting
    context: int | None = None
    parallel: int | None = None  # the slot count its latest start got
    started_at: float | None = None
    ready_at: float | None = None
    overcommit: str | None = None
    # usage
    served: int = 0
    dispatched_since_ready: int = 0
    last_used: float = -math.inf
    credit: float = 0.0  # GreedyDual-Size: evicted lowest first (where it may move)
    # its arrivals, each decayed by exp(-t / ARRIVAL_MEMORY_S) to time 0, as a
    # log (note_arrival): the log of its arrival rate at any time t plus t /
    # ARRIVAL_MEMORY_S, so that the order of two backends' rates does not move
    # with the clock, only with their arrivals
    heat: float = -math.inf
    # when its latest request came, and the recent gaps between its requests
    # (yard.core.estimates.idle_from: whether it will stay idle until a window)
    last_arrival: float = -math.inf
    last_app: str = ""  # the app of its latest request (yard.core.lending)
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=ARRIVAL_GAPS))
    # log of its reload seconds per GiB held, as of its last start or dispatch
    reload_log: float = 0.0
    # how many GPU sets it may take on this machine (yard.core.state.Core.options):
    # with more than one, its eviction may be a move elsewhere
    places: int = 1
    idle_since: float | None = None
    idle_token: int = 0
    drain_reason: str | None = None
    want_load: bool = False
    # work ahead (yard.core.windows): the stand-in for its best near window, and
    # the sentences a load for it and a refusal to evict it give
    ahead: Req | None = None
    ahead_load_why: str = ""
    ahead_keep_why: str = ""
    unload_requested: bool = False
    # starts that ran out of memory by yard's doing since it was last ready
    # (how far the next start steps down: yard.core.failures.step) and the
    # (gpus, context, alone) of each, never tried again
    self_caused_start_failures: int = 0
    # leaving the configuration (yard.core.catalog): why, and the spec that
    # replaces its own once it stopped (None: removed)
    retiring: str | None = None
    next_spec: BackendSpec | None = None
    failed_starts: set[tuple[tuple[str, ...], int | None, bool]] = field(default_factory=set)
    # every first start ran out of memory, the last alone at its minimum: why
    # it does not fit, and the memory other processes held on its devices
    # then (new requests are refused until some of that is freed)
    gave_up: tuple[str, dict[str, int]] | None = None
    # what the server itself reported taking once ready (llama-server's /props:
    # n_ctx, total_slots); None: it reports nothing
    served_context: int | None = None
    # what the core learned
    profile: Profile | None = None
    profile_has_load: bool = False
    learned_load_s: float | None = None
    service_ewma: float | None = None
    service_max: float | None = None
    service_recent: deque[float] = field(default_factory=lambda: deque(maxlen=SERVICE_WINDOW))
    service_recent_max: float = -math.inf  # max(service_recent), kept by note_service

    @property
    def estimate(self) -> Profile | None:
        """What placement goes by: the measured profile, else the prior read
        from the model file (None: nothing known)."""
        if self.profile is not None:
            return self.profile
        prior = self.spec.prior
        return prior.profile if prior is not None else None

    @property
    def primary(self) -> tuple[str, ...]:
        """The devices its loads are serialised on: its GPUs, or ``host``."""
        return self.gpus if self.gpus else (HOST,)

    def note_service(self, seconds: float) -> None:
        """Add a service time to the recent ones (and to their maximum)."""
        recent = self.service_recent
        dropped = recent[0] if len(recent) == recent.maxlen else -math.inf
        recent.append(seconds)
        if dropped >= self.service_recent_max:
            self.service_recent_max = max(recent)  # the longest one left the window
        elif seconds > self.service_recent_max:
            self.service_recent_max = seconds

    def note_arrival(self, now: float) -> None:
        """Count an arrival at ``now`` in :attr:`heat` (one add, one log) and
        its gap since the last one."""
        if self.last_arrival > -math.inf:
            self.gaps.append(now - self.last_arrival)
        self.last_arrival = now
        x = now / ARRIVAL_MEMORY_S
        h = self.heat
        if h == -math.inf:
            self.heat = x
        elif h >= x:
            self.heat = h + math.log1p(math.exp(x - h))
        else:
            self.heat = x + math.log1p(math.exp(h - x))

    @property
    def wait_reason(self) -> str:
        """Why it waits for a load (its plan's reason; "" before any)."""
        why = self.waiting_why
        if isinstance(why, str):
            return why
        text = self.waiting_why = why(self.name)
        return text

    @wait_reason.setter
    def wait_reason(self, text: str) -> None:
        self.waiting_why = text

    def head(self) -> Req | None:
        """What its planning ranks it by: its best waiting request, or the
        stand-in for work ahead when that ranks higher (None: neither)."""
        head = self.queue.head() if self.queue.size else None
        ahead = self.ahead
        if ahead is None or (
            head is not None
            and order_key(head, self.queue.boost) <= order_key(ahead, self.queue.boost)
        ):
            return head
        return ahead

    def busy(self) -> bool:
        return bool(self.running)

    @property
    def slots(self) -> int:
        """How many requests it serves at once: the slot count its latest start
        got where it has a parallel range, else its spec's."""
        return self.parallel if self.parallel is not None else self.spec.slots

    def free_slots(self) -> int:
        return self.slots - len(self.running)

    def held(self, device: str) -> int:
        """Memory it holds on ``device``: its reservation, or live use if higher."""
        return max(self.reserved.get(device, 0), self.live.get(device, 0))
