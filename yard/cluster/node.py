"""This yard as one node of a cluster: heartbeats, claiming shared jobs,
finding dead nodes, and living through a lost database.

Theory of operation. Jobs handed in on any node go into one shared queue in
PostgreSQL, unclaimed, ranked ``priority - aging_rate * created_at`` (linear
aging keeps the rank static, so one index orders the whole cluster). Each node
runs :class:`Node`:

- **Heartbeats** (every ``[cluster] heartbeat_s``): publish what this node
  serves, what is loaded, free memory per device, its queue per backend and its
  GPU models to the registry; then look for nodes whose heartbeat is older than
  ``dead_after_s``, and for each one this node is first to mark gone, reap it
  (its queued jobs go back to the shared queue at their old place, its running
  ones end ``interrupted``, or go back once when rerun-safe); then refresh the
  view the forwarder routes synchronous requests by.
- **Only a node that was watching judges.** A peer's silence counts only over
  time this node reached the database at every heartbeat (a gap of two starts
  the watch anew): a node cut off or stalled cannot tell a dead peer from one
  cut off with it. After an outage nobody is reaped until ``dead_after_s``
  after the watch resumed; while cut off, peers stay as last seen.
- **Claims**: woken by ``NOTIFY yard_jobs`` (a job became claimable on some
  node), by this node's own dispatches and finishes (room appeared), and by
  every heartbeat. It asks :func:`yard.cluster.policy.hungry` which backends
  have room here, claims the best-ranked job among them (``prefer``: the
  loaded ones, for ties only), and hands it to the job service with its
  original arrival, so that its age is the same on every node. One job at a
  time: the claimed job now waits here, which changes the room. A backend
  whose shared queue was found empty is asked again only once a job is
  announced for it (or at the next heartbeat).
- **A lost database**: no new claims (a node that cannot reach the shared
  queue must not guess at it); everything already here keeps being served;
  the job service holds finished results and writes them once the database is
  back. The node says so in its log (once, and once more when it is back),
  ``/healthz`` and the dashboard (:meth:`Node.statistics`).

A node restarted under the same name (killed with jobs claimed) gets them
back from the job service's restore, exactly as a restart on SQLite does
(:mod:`yard.jobs.restore`): the shared store gives it the jobs it holds.

Backend names are cluster-wide: a job's ``backend`` is claimed by name on any
node, so one backend name serves the same models on every node that has it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import trio

from yard.cluster.forward import Forwarder
from yard.cluster.jobs import ClusterJobStore, SharedQueue
from yard.cluster.listen import Listener
from yard.cluster.pg import PgDatabase, PgLimits
from yard.cluster.policy import (
    Peer,
    by_first_instance,
    counts_by_first_instance,
    hungry,
    local_backends,
    roomiest,
)
from yard.cluster.registry import NodeState, Registry
from yard.cluster.schema import ENDED_CHANNEL, JOBS_CHANNEL, MIGRATIONS, NODES_CHANNEL
from yard.config import Config
from yard.config.cluster import ClusterConfig
from yard.core.decisions import Decision, Dispatch
from yard.core.events import BackendExited, BackendReady, BackendStopped, Event, RequestFinished
from yard.core.spec import first_instance
from yard.core.views import Snapshot
from yard.db import DatabaseError
from yard.engine import Engine
from yard.errors import Rejected
from yard.h1.upstream import UpstreamPool
from yard.jobs.records import JobError, JobRecord
from yard.jobs.service import Jobs

log = logging.getLogger("yard.cluster")

MIB = 2**20


class EngineLike(Protocol):
    def snapshot(self, limit: int = 200) -> Snapshot: ...
    def watch(self, watcher: Callable[[float, Event | Decision], None]) -> None: ...


class JobsLike(Protocol):
    def enqueue(self, job: JobRecord, *, arrived_at_wall: float | None = None) -> None: ...
    async def ended_elsewhere(self, job_ids: AbstractSet[str] | None) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeView:
    """One node as this node last saw it in the registry (for the dashboard,
    ``yard status`` and ``/healthz``)."""

    name: str
    url: str
    state: str
    heartbeat_age_s: float
    database_ok: bool
    loaded: tuple[str, ...]
    queues: Mapping[str, int]
    serves: tuple[str, ...]
    free_mib: Mapping[str, float]
    gpu_models: tuple[str, ...]
    here: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatistics:
    """This node's part in the cluster, now.

    database_ok: the last call to the shared database reached it.
    database_lost_since: wall time it was lost (None while it is fine).
    claims: jobs claimed from the shared queue since start.
    reaped: dead nodes this node reaped.
    forwarded: synchronous requests forwarded to other nodes.
    nodes: every node of the registry, as last read.
    """

    node: str
    url: str
    database_ok: bool
    database_lost_since: float | None
    claims: int
    reaped: int
    forwarded: int
    nodes: tuple[NodeView, ...]


class Node:
    """This yard as a node of the cluster (see the module's theory).

    Start :meth:`run` with ``nursery.start`` after the job service runs;
    ready once its first heartbeat is published (or the database was found
    lost: the node serves anyway).
    """

    def __init__(
        self,
        *,
        config: Config,
        cluster: ClusterConfig,
        engine: EngineLike,
        jobs: JobsLike,
        store: ClusterJobStore,
        registry: Registry,
        listen: Callable[[], Listener],
        forwarder: Forwarder,
        gpu_models: Sequence[str] = (),
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.name = cluster.node
        self.url = cluster.node_url(config.server)
        self.engine = engine
        self.jobs = jobs
        self.store = store
        self.registry = registry
        self.forwarder = forwarder
        self._listen = listen
        self._gpu_models = tuple(gpu_models)
        self._wall = wall
        self._started_at = wall()
        self._wake = trio.Event()
        self._database_ok = True
        self._lost_since: float | None = None
        # Since when it reached the database at every heartbeat (None: cut off).
        self._watching_since: float | None = None
        self._published_at: float | None = None
        self._claims = 0
        self._reaped = 0
        self._nodes: tuple[NodeState, ...] = ()
        # Backends whose unclaimed queue was empty at the last claim, and a
        # count of job announcements (NOTIFY yard_jobs) to tell whether one
        # came in while that claim was on its way.
        self._empty: set[str] = set()
        self._notices = 0
        self._models = {model: backend for model, backend in config.models()}
        self._slots = {b.name: b.slots for b in config.backends.values()}
        self._gpus_of = {b.name: tuple(b.gpus) for b in config.backends.values()}
        self._ranges_of = {b.name: (b.context, b.parallel) for b in config.backends.values()}
        self._margin = config.scheduler.profile_margin
        engine.watch(self._seen)

    # -- the outside ------------------------------------------------------------

    def wake(self) -> None:
        """Look for work now (a job was handed in here, room appeared)."""
        self._wake.set()

    @property
    def database_ok(self) -> bool:
        return self._database_ok

    def statistics(self) -> NodeStatistics:
        now = self._wall()
        views = tuple(
            NodeView(
                name=n.name,
                url=n.url,
                state=n.state,
                heartbeat_age_s=max(0.0, now - n.heartbeat_at),
                database_ok=n.database_ok,
                loaded=tuple(n.loaded),
                queues=dict(n.queues),
                serves=tuple(n.serves),
                free_mib=dict(n.free_mib),
                gpu_models=tuple(n.gpu_models),
                here=n.name == self.name,
            )
            for n in sorted(self._nodes, key=lambda n: n.name)
        )
        return NodeStatistics(
            node=self.name,
            url=self.url,
            database_ok=self._database_ok,
            database_lost_since=self._lost_since,
            claims=self._claims,
            reaped=self._reaped,
            forwarded=self.forwarder.forwarded,
            nodes=views,
        )

    def health(self) -> dict[str, object]:
        """What ``GET /healthz`` answers on a node: ``status`` ``ok`` (it
        serves), or ``degraded`` while the shared database is lost (it still
        serves what it has, claims nothing new), and every node as last seen."""
        stats = self.statistics()
        return {
            "status": "ok" if stats.database_ok else "degraded",
            "node": stats.node,
            "database": "ok" if stats.database_ok else "lost",
            "database_lost_since": stats.database_lost_since,
            "nodes": [
                {
                    "name": n.name,
                    "url": n.url,
                    "state": n.state,
                    "heartbeat_age_s": round(n.heartbeat_age_s, 3),
                    "database_ok": n.database_ok,
                    "loaded": list(n.loaded),
                    "queues": dict(n.queues),
                    "serves": list(n.serves),
                }
                for n in stats.nodes
            ],
        }

    # -- running ----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Publish, then heartbeat, listen and claim until cancelled. (The
        jobs this node held in its previous life are restored by the job
        service, as after any restart: the store gives it this node's own.)"""
        await self._heartbeat()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeats)
            nursery.start_soon(self._listen_forever)
            nursery.start_soon(self._claim_forever)
            task_status.started()

    async def _heartbeats(self) -> None:
        while True:
            await trio.sleep(self.cluster.heartbeat_s)
            await self._heartbeat()
            # Look at every backend again (an announcement may have been lost).
            self._jobs_announced(None)
            self.wake()

    async def _heartbeat(self) -> None:
        """Publish this node, find and reap dead ones, refresh the routing view."""
        snapshot = self.engine.snapshot(limit=0)
        now = self._wall()
        try:
            await self.registry.publish(self._describe(snapshot, now))
            self._watched(now)
            for name in await self.registry.stale(now, self.cluster.dead_after_s):
                if name == self.name or not self._may_judge(now):
                    continue
                # Declared gone and reaped at once: no node sees it gone while
                # it still holds jobs (they would claim newer ones first).
                before = now - self.cluster.dead_after_s
                summary = await self.store.reap_gone(name, now=now, heartbeat_before=before)
                if summary is not None:
                    self._reaped += 1
                    log.warning(
                        "node %s stopped sending heartbeats (none for %g s): taken as gone; "
                        "its jobs: %s",
                        name,
                        self.cluster.dead_after_s,
                        summary.describe(),
                    )
            self._nodes = tuple(await self.registry.nodes())
            self._database(True)
        except DatabaseError as exc:
            self._database(False, exc)
        self._update_routes(snapshot, now)

    def _watched(self, now: float) -> None:
        last, self._published_at = self._published_at, now
        if self._watching_since is None or now - (last or 0.0) > 2 * self.cluster.heartbeat_s:
            self._watching_since = now

    def _may_judge(self, now: float) -> bool:
        """Watched for ``dead_after_s`` without a break (the module's theory)."""
        since = self._watching_since
        return since is not None and now - since >= self.cluster.dead_after_s

    def _describe(self, snapshot: Snapshot, now: float) -> NodeState:
        # Loading counts as loaded: other nodes leave its jobs to this one.
        loaded = tuple(b.name for b in snapshot.backends if b.state in ("ready", "starting"))
        return NodeState(
            name=self.name,
            url=self.url,
            heartbeat_at=now,
            started_at=self._started_at,
            serves=tuple(self._models),
            backends=tuple(self._slots),
            loaded=loaded,
            free_mib={d.name: d.free_bytes / MIB for d in snapshot.devices},
            queues={b.name: b.queued for b in snapshot.backends if b.queued},
            gpu_models=self._gpu_models,
            database_ok=self._database_ok,
            state="up",
        )

    def _update_routes(self, snapshot: Snapshot, now: float) -> None:
        peers: list[Peer] = []
        urls: dict[str, str] = {}
        for n in self._nodes:
            if n.name == self.name:
                continue
            # Silence counts from when this node watches (never while cut off).
            since = self._watching_since
            up = n.state == "up" and (
                since is None or now - max(n.heartbeat_at, since) <= self.cluster.dead_after_s
            )
            serves = frozenset(n.serves)
            backend_of = {m: self._backend_of(m, n) for m in serves}
            # A model is ready there when any instance of its backend is.
            loaded = {first_instance(b) for b in n.loaded}
            ready = frozenset(m for m, b in backend_of.items() if b in loaded)
            queues = counts_by_first_instance(n.queues)
            waiting = {m: queues.get(b, 0) for m, b in backend_of.items() if b}
            peers.append(
                Peer(
                    name=n.name,
                    up=up,
                    serves=serves,
                    ready=ready,
                    waiting=waiting,
                    free_mib=roomiest(n.free_mib),
                    backend_of={m: b for m, b in backend_of.items() if b},
                )
            )
            urls[n.name] = n.url
        here_ready = {first_instance(b.name) for b in snapshot.backends if b.state == "ready"}
        queued = counts_by_first_instance({b.name: b.queued for b in snapshot.backends})
        peers.append(
            Peer(
                name=self.name,
                serves=frozenset(self._models),
                ready=frozenset(m for m, b in self._models.items() if b in here_ready),
                waiting={m: queued.get(b, 0) for m, b in self._models.items()},
                free_mib=roomiest({d.name: d.free_bytes / MIB for d in snapshot.devices}),
            )
        )
        urls[self.name] = self.url
        self.forwarder.update(peers, urls)

    def _jobs_announced(self, backends: AbstractSet[str] | None) -> None:
        """Jobs became claimable for ``backends`` (None: perhaps for any)."""
        self._notices += 1
        if backends is None:
            self._empty.clear()
        else:
            self._empty.difference_update(backends)

    def _backend_of(self, model: str, node: NodeState) -> str | None:
        """The backend serving ``model`` on ``node``: the one of this node's
        configuration (backend names are cluster-wide), or the node's only
        backend; None when that cannot be told (it is then not taken for
        ready there, though requests may still go there to be loaded)."""
        here = self._models.get(model)
        if here is not None:
            return here
        backends = {first_instance(b) for b in node.backends}
        return backends.pop() if len(backends) == 1 else None

    def _database(self, ok: bool, exc: BaseException | None = None) -> None:
        if not ok:
            self._watching_since = None
        if ok and not self._database_ok:
            lost = self._wall() - (self._lost_since or self._wall())
            log.warning(
                "node %s: the shared database is back (lost for %.1f s); claiming again",
                self.name,
                lost,
            )
            self._lost_since = None
        elif not ok and self._database_ok:
            log.error(
                "node %s: lost the shared database (%s): no new jobs are claimed; what is "
                "here is still served, and results are written once it is back",
                self.name,
                exc,
            )
            self._lost_since = self._wall()
        self._database_ok = ok

    async def _listen_forever(self) -> None:
        # The listener reconnects by itself (and then reports every channel).
        async with self._listen() as listener:
            while True:
                fired = await listener.wait()
                if JOBS_CHANNEL in fired:
                    self._jobs_announced(listener.payloads(JOBS_CHANNEL))
                if fired - {ENDED_CHANNEL}:
                    self.wake()
                if ENDED_CHANNEL in fired:
                    # Jobs that ended on some node (or, None: maybe any).
                    await self._ended_elsewhere(listener.payloads(ENDED_CHANNEL))

    async def _ended_elsewhere(self, job_ids: AbstractSet[str] | None) -> None:
        """Tell the job service that ``job_ids`` ended. Looking them up needs
        the database: while it is lost, look again every heartbeat, at every
        job (a cancel made elsewhere meanwhile must still reach the request
        running here), instead of letting the error end the node."""
        while True:
            try:
                await self.jobs.ended_elsewhere(job_ids)
                return
            except DatabaseError as exc:
                self._database(False, exc)
            job_ids = None
            await trio.sleep(self.cluster.heartbeat_s)

    async def leave(self) -> None:
        """A graceful stop: after the job service has stopped, hand this
        node's unfinished jobs back as if it had died (queued ones to the
        shared queue at their old place, running ones interrupted or rerun
        once), so that the other nodes need not wait ``dead_after_s``."""
        try:
            summary = await self.store.reap(self.name, now=self._wall())
            await self.registry.mark_gone(self.name)
        except DatabaseError as exc:
            log.warning("node %s: could not hand its jobs back as it stopped (%s)", self.name, exc)
            return
        log.info("node %s left the cluster; its jobs: %s", self.name, summary.describe())

    # -- claiming ---------------------------------------------------------------

    async def _claim_forever(self) -> None:
        while True:
            self._wake = trio.Event()
            if self._database_ok:
                try:
                    await self._claim_while_hungry()
                except DatabaseError as exc:
                    self._database(False, exc)
            with trio.move_on_after(self.cluster.heartbeat_s):
                await self._wake.wait()

    async def _claim_while_hungry(self) -> None:
        while True:
            snapshot = self.engine.snapshot(limit=0)
            loaded, room = self._elsewhere()
            hunger = hungry(
                by_first_instance(
                    local_backends(
                        snapshot,
                        gpus_of=self._gpus_of,
                        margin=self._margin,
                        ranges_of=self._ranges_of,
                    )
                ),
                loaded_elsewhere=loaded,
                room_elsewhere=room,
                ahead=self.cluster.claim_ahead,
            )
            # Backends whose shared queue was found empty, with no job announced
            # for them since, are not asked again: a node busy with synchronous
            # requests wakes on every dispatch, and must not ask the database
            # each time.
            wanted = [b for b in hunger.claim if b not in self._empty]
            if not wanted:
                return
            notices = self._notices
            job = await self.store.claim(self.name, wanted, prefer=hunger.prefer)
            if job is None:
                if notices == self._notices:
                    self._empty.update(wanted)
                return
            self._claims += 1
            try:
                self.jobs.enqueue(job, arrived_at_wall=job.created_at)
            except Rejected as exc:
                await self.store.finish(
                    job.id,
                    "failed",
                    at=self._wall(),
                    error=JobError(code=exc.code, message=exc.message, status=exc.status),
                )

    def _elsewhere(self) -> tuple[frozenset[str], frozenset[str]]:
        """Backends another node has loaded (or loading), and backends another
        node could load into free memory (any free memory: the registry does
        not carry profiles). A node counts until it is marked gone, even with a
        stale heartbeat: its jobs come back with the reap, and must be claimed
        before newer ones (their old place), so nobody loads its backends
        before that."""
        loaded: set[str] = set()
        room: set[str] = set()
        for n in self._nodes:
            if n.name == self.name or n.state != "up":
                continue
            # By first instance, as the claim sees backends (by_first_instance).
            loaded |= {first_instance(b) for b in n.loaded}
            if roomiest(n.free_mib) > 0:
                room |= {first_instance(b) for b in set(n.backends) - set(n.loaded)}
        return frozenset(loaded), frozenset(room)

    def _seen(self, at: float, item: Event | Decision) -> None:
        # Inside the engine's loop: only set an event.
        if isinstance(item, _WAKERS):
            self._wake.set()


_WAKERS = (Dispatch, RequestFinished, BackendReady, BackendExited, BackendStopped)
"""What makes room here, or changes what is loaded: the claim loop looks again."""


async def open_database(cluster: ClusterConfig) -> PgDatabase:
    """Connect to the cluster's database and migrate it (once, whichever
    node comes first). Raises :class:`yard.db.DatabaseError` when it cannot
    be reached: a node that never reached it has nothing to serve from it."""
    return await PgDatabase.open(
        cluster.database,
        MIGRATIONS,
        application_name=f"yard {cluster.node}",
        limits=PgLimits(
            connect_timeout_s=cluster.connect_timeout_s,
            idle_in_transaction_s=cluster.idle_in_transaction_s,
            lock_timeout_s=cluster.lock_timeout_s,
            statement_timeout_s=cluster.statement_timeout_s,
        ),
    )


@asynccontextmanager
async def open_node(
    *,
    config: Config,
    db: PgDatabase,
    engine: Engine,
    pool: UpstreamPool,
    gpu_models: Sequence[str] = (),
    wall: Callable[[], float] = time.time,
) -> AsyncIterator[tuple[Node, Jobs]]:
    """Yield this node and its job service on the shared queue in ``db``
    (:func:`open_database`; the caller closes it), neither running yet: start
    ``jobs.run``, then ``node.run``, with ``nursery.start``. On the way out the
    job service stops and the node hands its jobs back (:meth:`Node.leave`).
    """
    cluster = config.cluster
    if cluster is None:
        raise ValueError("open_node needs a configuration with [cluster]")
    store = ClusterJobStore(db, node=cluster.node, aging_rate=config.scheduler.aging_rate)
    queue = SharedQueue(lambda job_id: store.release(job_id, cluster.node))
    jobs = Jobs(engine=engine, store=store, pool=pool, config=config.jobs, wall=wall, queue=queue)
    node = Node(
        config=config,
        cluster=cluster,
        engine=engine,
        jobs=jobs,
        store=store,
        registry=Registry(db),
        listen=lambda: Listener(cluster.database, (JOBS_CHANNEL, NODES_CHANNEL, ENDED_CHANNEL)),
        forwarder=Forwarder(node=cluster.node, secret=cluster.secret, pool=pool),
        gpu_models=gpu_models,
        wall=wall,
    )
    queue.wake = node.wake
    try:
        yield node, jobs
    finally:
        with trio.CancelScope(shield=True):
            await jobs.stop()
            with trio.move_on_after(max(5.0, cluster.heartbeat_s)):
                await node.leave()
