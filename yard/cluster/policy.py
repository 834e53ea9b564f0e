"""Which shared jobs a node claims, and where a synchronous request is served.

Pure functions over small records, no I/O (like :mod:`yard.core`, the only part of
yard it reads): the node (:mod:`yard.cluster.node`) builds the records from its
engine's snapshot and the registry, the simulation (:mod:`sim.cluster`) from its
simulated hosts, and both get the same answers.

The rules these functions keep:

- **A node claims only what it can start soon.** For a backend that is ready, as
  many jobs as it has free slots (slots minus running minus waiting here); for one
  that is loading, enough to fill its slots once it is ready; for one that is
  stopped, one job (the one whose arrival makes the node load it), and only when
  the node could start it now, no other node has it loaded or loading, and no
  other node could load it without evicting anything when this one would have to.
  A node never holds a shared job it cannot start, so it never hoards the queue,
  and one instance of each backend serves the cluster unless memory says
  otherwise, so loads stay near one host's.
- **One priority order across the cluster.** :func:`hungry` says *which* backends a
  node may take a job for, not which job: the claim itself takes the best-ranked
  waiting job among them (``rank = priority - aging_rate * arrival``, static under
  linear aging). ``prefer`` (backends loaded here) only breaks ties between equal
  ranks. A node re-asks :func:`hungry` after every claim, since the claimed job now
  waits here.
- **A forwarded request is never forwarded again**, and routing is deterministic:
  the same records give the same node, on every node, so two nodes never send a
  request back and forth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from yard.core import resources
from yard.core.spec import HOST, Profile, first_instance
from yard.core.views import DeviceView, Snapshot

Ranges = tuple[tuple[int, int] | None, tuple[int, int] | None]
"""A backend's context and slot ranges (min, max), each None where fixed."""

BackendState = Literal["stopped", "loading", "ready"]

Fit = Literal["free", "evict", "busy", "no"]
"""Whether a stopped backend could start on this node now: ``free`` (it fits in free
memory), ``evict`` (it fits once idle backends are stopped), ``busy`` (it fits only
once work running here ends: the core will drain a backend for it), ``no`` (a load
is in progress on its devices, or it does not fit here at all)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalBackend:
    """One backend this node serves, as the node's own engine sees it now.

    name: the backend's name (the shared queue's ``backend`` column).
    slots: how many requests it serves at once.
    state: ``"ready"`` (loaded, taking work), ``"loading"`` (started, not ready
        yet) or ``"stopped"`` (anything else: not loaded, stopping, failed).
    running: requests it is serving now.
    waiting: requests waiting here for it (claimed jobs not yet dispatched and
        local synchronous requests).
    fits: for a stopped backend, whether it could start now (see :data:`Fit`);
        :func:`local_backends` works it out from the engine's snapshot.
    """

    name: str
    slots: int = 1
    state: BackendState = "stopped"
    running: int = 0
    waiting: int = 0
    fits: Fit = "free"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a backend needs a name")
        if self.slots < 1:
            raise ValueError(f"backend {self.name}: slots must be at least 1")
        if self.running < 0 or self.waiting < 0:
            raise ValueError(f"backend {self.name}: running and waiting cannot be negative")


@dataclass(frozen=True, slots=True, kw_only=True)
class Hunger:
    """What a node should claim now.

    claim: the backends to pass to the claim (sorted by name); empty: claim nothing.
    prefer: those of ``claim`` that are loaded or loading here (ties between equal
        ranks go to them).
    """

    claim: tuple[str, ...] = ()
    prefer: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.claim)


def room_for(backend: LocalBackend, *, ahead: int = 0) -> int:
    """How many more shared jobs this node may claim for ``backend`` now, by its own
    state alone (:func:`hungry` also weighs the other nodes).

    ahead: extra jobs that may wait here beyond the free slots of a ready or
        loading backend (0: none; a few hide the claim's round trip to the
        database between one job's end and the next one's start, at the cost of
        holding jobs another node might start sooner).
    """
    if backend.state == "stopped":
        # One job makes the node load it; more are claimed once it is loading.
        idle = backend.waiting == 0 and backend.running == 0
        return 1 if idle and backend.fits != "no" else 0
    return max(0, backend.slots + ahead - backend.running - backend.waiting)


def hungry(
    backends: Sequence[LocalBackend],
    *,
    loaded_elsewhere: frozenset[str] = frozenset(),
    room_elsewhere: frozenset[str] = frozenset(),
    ahead: int = 0,
) -> Hunger:
    """The backends this node should claim a shared job for now, and which it prefers.

    backends: every backend this node serves (others are never claimed for).
    loaded_elsewhere: backends another live node has loaded or loading (the
        registry's ``loaded``). A stopped backend here is left to that node: one
        instance in the cluster serves its jobs, as one instance does on one host.
    room_elsewhere: stopped backends another live node could load into its free
        memory (the registry's ``free_mib`` against the profile). A stopped backend
        that fits here only by evicting idle ones or draining busy ones is left to
        that node. One that fits here only after a drain, with no room elsewhere, is
        claimed: the core then drains a backend for it, as on one host (otherwise
        a busy node would never give way to work it alone can take).
    ahead: see :func:`room_for`.

    Returns a :class:`Hunger`; the claim takes the best-ranked job among
    ``claim``, ``prefer`` breaking ties only. Call again after each claim.
    """
    if ahead < 0:
        raise ValueError("ahead cannot be negative")
    claim: set[str] = set()
    prefer: set[str] = set()
    for backend in backends:
        if backend.state == "stopped" and (
            backend.name in loaded_elsewhere
            or (backend.fits in ("evict", "busy") and backend.name in room_elsewhere)
        ):
            continue
        if room_for(backend, ahead=ahead) > 0:
            claim.add(backend.name)
            if backend.state != "stopped":
                prefer.add(backend.name)
    return Hunger(claim=tuple(sorted(claim)), prefer=tuple(sorted(prefer)))


def local_backends(
    snapshot: Snapshot,
    *,
    gpus_of: Mapping[str, tuple[str, ...]],
    margin: float,
    ranges_of: Mapping[str, Ranges] | None = None,
) -> list[LocalBackend]:
    """This node's backends for :func:`hungry`, from its engine's snapshot.

    ranges_of: each backend's context and slot ranges (its spec; none: fixed).
        A running backend counts at what it runs with; a stopped one at the
        smallest start the core would make room for (its *required* part).
    gpus_of: the GPUs each backend may use (its spec; a stopped backend's view
        names none). margin: the scheduler's ``profile_margin``.

    A stopped backend ``fits`` ``free`` when its profile (times ``margin``) fits in
    the free memory of one of its GPUs and of the host, ``evict`` when it fits
    there once ready backends with nothing running or waiting are stopped,
    ``busy`` when it fits in the GPU's usable memory less foreign use and pinned
    backends, ``no`` otherwise or while another backend is starting on that GPU
    (one load at a time). A backend with no profile yet loads alone, so it fits ``free`` only on
    a GPU with nothing on it. A draining or stopping backend counts as stopped and
    cannot start again until it is gone.
    """
    devices = {d.name: d for d in snapshot.devices}
    views = snapshot.backends
    starting_on = {g for b in views if b.state == "starting" for g in b.gpus}
    occupied = {g for b in views if b.gpus for g in b.gpus}
    pinned_on: dict[str, int] = {}
    for b in views:
        if b.pinned:
            for where in b.gpus:
                pinned_on[where] = pinned_on.get(where, 0) + _need(
                    b.profile, where, margin, b.context, b.parallel
                )
    idle_on: dict[str, int] = {}
    for b in views:
        if b.state == "ready" and not b.inflight and not b.queued and not b.pinned:
            for where in (*b.gpus, HOST):
                if where in devices:
                    dev = devices[where]
                    need = _need(b.profile, where, margin, b.context, b.parallel)
                    idle_on[where] = idle_on.get(where, 0) + max(
                        need, dev.live_bytes.get(b.name, 0)
                    )
    out = []
    for b in views:
        state: BackendState
        fits: Fit = "no"
        if b.state == "ready":
            state = "ready"
        elif b.state == "starting":
            state = "loading"
        else:
            state = "stopped"
            if b.state in ("stopped", "failed"):
                gpus = gpus_of.get(b.name, ())
                context, parallel = (ranges_of or {}).get(b.name, (None, None))
                fits = _fits(
                    b.profile,
                    gpus,
                    (
                        resources.context_of(context, b.profile, gpus),
                        resources.parallel_of(parallel, b.profile, gpus),
                    ),
                    devices,
                    starting_on,
                    occupied,
                    idle_on,
                    pinned_on,
                    margin,
                )
        out.append(
            LocalBackend(
                name=b.name,
                slots=b.slots,
                state=state,
                running=b.inflight,
                waiting=b.queued,
                fits=fits,
            )
        )
    return out


def by_first_instance(backends: Sequence[LocalBackend]) -> list[LocalBackend]:
    """``backends`` for :func:`hungry`, with the instances of each backend
    (``NAME``, ``NAME@2``, ...; see :mod:`yard.core.instances`) also counted as one
    named ``NAME``.

    Jobs for the model name its backend, ``NAME``, and the node's core routes
    each job it claims among the instances; so a node claims ``NAME`` jobs for
    what its instances take together. The group is ``ready`` when an instance
    is, else ``loading`` when one is, else ``stopped`` (then it ``fits`` as its
    first instance, which the core loads first). Its ``slots`` are those of its
    ready and loading instances, plus one while a further instance is stopped
    with nothing waiting for it and could start (the one job that makes the core
    weigh loading it); ``running`` and ``waiting`` are its instances' sums. The
    further instances stay in the list as they are, for the jobs sent to one by
    its name (``/backends/NAME@2/...``). A backend with one instance is as it was.
    """
    groups: dict[str, list[LocalBackend]] = {}
    for backend in backends:
        groups.setdefault(first_instance(backend.name), []).append(backend)
    out: list[LocalBackend] = []
    further: list[LocalBackend] = []
    for name, members in groups.items():
        further += [m for m in members if m.name != name]
        if len(members) == 1 and members[0].name == name:
            out.append(members[0])
            continue
        states = {m.state for m in members}
        state: BackendState = (
            "ready" if "ready" in states else "loading" if "loading" in states else "stopped"
        )
        first = next((m for m in members if m.name == name), members[0])
        running = sum(m.running for m in members)
        waiting = sum(m.waiting for m in members)
        if state == "stopped":
            out.append(
                LocalBackend(
                    name=name, slots=first.slots, running=running, waiting=waiting, fits=first.fits
                )
            )
            continue
        slots = sum(m.slots for m in members if m.state != "stopped")
        slots += sum(
            1
            for m in members
            if m.state == "stopped" and m.fits != "no" and not m.waiting and not m.running
        )
        out.append(
            LocalBackend(name=name, slots=slots, state=state, running=running, waiting=waiting)
        )
    return out + further


def _need(
    profile: Profile | None,
    device: str,
    margin: float,
    context: int | None = None,
    parallel: int | None = None,
) -> int:
    """The reservation on ``device`` at ``context`` and ``parallel`` slots
    (None: as measured), as the core reckons it (:func:`resources.need_at`)."""
    gpus = () if device == HOST else (device,)
    return resources.need_at(profile, gpus, margin, context, parallel)[device]


def _fits(
    profile: Profile | None,
    gpus: tuple[str, ...],
    required: tuple[int | None, int | None],
    devices: Mapping[str, DeviceView],
    starting_on: set[str],
    occupied: set[str],
    idle_on: Mapping[str, int],
    pinned_on: Mapping[str, int],
    margin: float,
) -> Fit:
    host = devices.get(HOST)
    host_need = _need(profile, HOST, margin, *required)
    host_free = host.free_bytes if host is not None else host_need
    host_idle = idle_on.get(HOST, 0)
    order: tuple[Fit, ...] = ("free", "evict", "busy", "no")
    best: Fit = "no"
    for gpu in gpus or (HOST,):
        dev = devices.get(gpu)
        if dev is None or gpu in starting_on:
            continue
        found: Fit
        if profile is None:
            # Measured alone: an empty GPU, or one that can be emptied.
            found = "busy" if gpu in occupied else "free"
        else:
            need = _need(profile, gpu, margin, *required) if gpu != HOST else host_need
            usable = dev.total_bytes - dev.reserve_bytes - dev.foreign_bytes
            if need <= dev.free_bytes and host_need <= host_free:
                found = "free"
            elif (
                need <= dev.free_bytes + idle_on.get(gpu, 0) and host_need <= host_free + host_idle
            ):
                found = "evict"
            elif need <= usable - pinned_on.get(gpu, 0):
                found = "busy"
            else:
                found = "no"
        if order.index(found) < order.index(best):
            best = found
    return best


@dataclass(frozen=True, slots=True, kw_only=True)
class Peer:
    """One node as the registry shows it, for routing.

    name: the node's name (unique in the cluster).
    up: its heartbeat is fresh (a node that is gone gets nothing).
    serves: the models it serves.
    ready: those of ``serves`` whose backend is loaded and ready there.
    loading: those of ``serves`` whose backend is loading there.
    waiting: requests waiting there, per model (absent: 0).
    free_mib: free memory on its roomiest GPU (or host, for host-only nodes), MiB.
    backend_of: the backend serving each model there, where it can be told.
    """

    name: str
    up: bool = True
    serves: frozenset[str] = frozenset()
    ready: frozenset[str] = frozenset()
    loading: frozenset[str] = frozenset()
    waiting: Mapping[str, int] = field(default_factory=dict, hash=False)
    free_mib: float = 0.0
    backend_of: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a node needs a name")
        if not (self.ready | self.loading) <= self.serves:
            raise ValueError(f"node {self.name}: ready and loading models must be served there")


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """Where a synchronous request goes.

    node: the node's name (``here`` to serve it locally).
    forward: whether that is another node.
    reason: why, in words (logged, and shown to the app in a header).
    """

    node: str
    forward: bool
    reason: str


def route(
    model: str,
    nodes: Sequence[Peer],
    here: str,
    *,
    forwarded: bool = False,
    need_mib: float | None = None,
) -> Route:
    """Serve a synchronous request for ``model`` here, or forward it to which node.

    nodes: the registry's nodes (``here`` among them or not).
    here: this node's name.
    forwarded: the request came from another node; it is served here, whatever
        the registry says (no loops).
    need_mib: the model's measured size, if a profile is known; a node whose free
        memory holds it can load it without evicting anything.

    The order: a node with the model ready, fewest waiting first; else one
    loading it (one instance, one load); else one that can load it into free
    memory (fewest waiting for it, then most free memory); else any node that
    serves it, the same way. Ties go to ``here`` (no hop),
    then to the smallest name, so every node routes the same records alike. A
    model no live node serves is served here (which refuses it with
    ``model_not_found``).
    """
    if forwarded:
        return Route(node=here, forward=False, reason="forwarded here by another node")
    candidates = [n for n in nodes if n.up and model in n.serves]
    if not candidates:
        return Route(node=here, forward=False, reason=f"no live node serves {model}")

    def key(node: Peer) -> tuple[int, int, float, bool, str]:
        if model in node.ready:
            tier = 0
        elif model in node.loading:
            tier = 1
        elif need_mib is None or node.free_mib >= need_mib:
            tier = 2
        else:
            tier = 3
        # Free memory matters only when a load is needed.
        free = 0.0 if tier <= 1 else -node.free_mib
        return (tier, node.waiting.get(model, 0), free, node.name != here, node.name)

    best = min(candidates, key=key)
    tier = key(best)[0]
    why = (
        f"{model} is ready on {best.name}",
        f"{model} is loading on {best.name}",
        f"{best.name} can load {model} into free memory soonest",
        f"{best.name} can load {model} soonest",
    )[tier]
    return Route(node=best.name, forward=best.name != here, reason=why)


def counts_by_first_instance(counts: Mapping[str, int]) -> dict[str, int]:
    """Per-backend counts summed over each backend's instances."""
    out: dict[str, int] = {}
    for name, count in counts.items():
        first = first_instance(name)
        out[first] = out.get(first, 0) + count
    return out


def roomiest(free: Mapping[str, float]) -> float:
    """The free memory of a node's roomiest GPU (its host's, if it has none)."""
    gpus = [v for k, v in free.items() if k != "host"]
    values = gpus or list(free.values())
    return max(values) if values else 0.0
