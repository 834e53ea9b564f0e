"""Which shared jobs a node claims, and where a synchronous request is served.

Pure functions over small records, no I/O (like :mod:`yard.core`): the node
(:mod:`yard.cluster.node`) builds the records from its engine's snapshot and the
registry, the simulation (:mod:`sim.cluster`) builds them from its simulated hosts,
and both get the same answers.

The rules these functions keep:

- **A node claims only what it can start soon.** For a backend that is ready, as
  many jobs as it has free slots (slots minus running minus waiting here); for one
  that is loading, enough to fill its slots once it is ready; for one that is
  stopped, one job (the one whose arrival makes the node load it), and only when
  the node could start it now and no other node has it ready with a free slot. A
  node never holds a shared job it cannot start, so it never hoards the queue.
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

BackendState = Literal["stopped", "loading", "ready"]


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
    startable: this node could start it now: it fits next to the backends that
        are busy, once idle ones are stopped, and its devices are not loading
        something else. Read only for a stopped backend.
    """

    name: str
    slots: int = 1
    state: BackendState = "stopped"
    running: int = 0
    waiting: int = 0
    startable: bool = True

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
    """How many more shared jobs this node may claim for ``backend`` now.

    ahead: extra jobs that may wait here beyond the free slots of a ready or
        loading backend (0: none; a few hide the claim's round trip to the
        database between one job's end and the next one's start, at the cost of
        holding jobs another node might start sooner).
    """
    if backend.state == "stopped":
        # One job makes the node load it; more are claimed once it is loading.
        return 1 if backend.startable and backend.waiting == 0 and backend.running == 0 else 0
    return max(0, backend.slots + ahead - backend.running - backend.waiting)


def hungry(
    backends: Sequence[LocalBackend],
    *,
    ready_elsewhere: frozenset[str] = frozenset(),
    ahead: int = 0,
) -> Hunger:
    """The backends this node should claim a shared job for now, and which it prefers.

    backends: every backend this node serves (others are never claimed for).
    ready_elsewhere: backends another live node has ready with a free slot (from
        the registry). A stopped backend here is not claimed for while another node
        can start its jobs without a load; a ready or loading one still is.
    ahead: see :func:`room_for`.

    Returns a :class:`Hunger`; the claim takes the best-ranked job among
    ``claim``, ``prefer`` breaking ties only. Call again after each claim.
    """
    if ahead < 0:
        raise ValueError("ahead cannot be negative")
    claim: set[str] = set()
    prefer: set[str] = set()
    for backend in backends:
        if backend.state == "stopped" and backend.name in ready_elsewhere:
            continue
        if room_for(backend, ahead=ahead) > 0:
            claim.add(backend.name)
            if backend.state != "stopped":
                prefer.add(backend.name)
    return Hunger(claim=tuple(sorted(claim)), prefer=tuple(sorted(prefer)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Peer:
    """One node as the registry shows it, for routing.

    name: the node's name (unique in the cluster).
    up: its heartbeat is fresh (a node that is gone gets nothing).
    serves: the models it serves.
    ready: those of ``serves`` whose backend is loaded and ready there.
    waiting: requests waiting there, per model (absent: 0).
    free_mib: free memory on its roomiest GPU (or host, for host-only nodes), MiB.
    """

    name: str
    up: bool = True
    serves: frozenset[str] = frozenset()
    ready: frozenset[str] = frozenset()
    waiting: Mapping[str, int] = field(default_factory=dict, hash=False)
    free_mib: float = 0.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a node needs a name")
        if not self.ready <= self.serves:
            raise ValueError(f"node {self.name}: ready models must be served there")


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

    The order: a node with the model ready, fewest waiting first; else one that
    can load it into free memory (fewest waiting for it, then most free memory);
    else any node that serves it, the same way. Ties go to ``here`` (no hop),
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
        elif need_mib is None or node.free_mib >= need_mib:
            tier = 1
        else:
            tier = 2
        # Free memory matters only when a load is needed.
        free = 0.0 if tier == 0 else -node.free_mib
        return (tier, node.waiting.get(model, 0), free, node.name != here, node.name)

    best = min(candidates, key=key)
    tier = key(best)[0]
    why = (
        f"{model} is ready on {best.name}",
        f"{best.name} can load {model} into free memory soonest",
        f"{best.name} can load {model} soonest",
    )[tier]
    return Route(node=best.name, forward=best.name != here, reason=why)
