"""Two hosts, one queue: the radio day on two one-GPU hosts that share a simulated
database (issue 13), beside the one-host day.

Each host is what :mod:`sim.runner` simulates for one machine: its own
:class:`~sim.world.SimWorld` (one 24 GiB GPU), its own :class:`~yard.engine.Engine`
and its own core. Only what PostgreSQL would share is simulated here, with a
latency on every trip to it:

- **Jobs** (the newsroom's scripts and voice-overs, show art, overnight music) are
  handed in asynchronously at a host drawn at random. After the insert's latency
  they wait in the shared queue at their static rank (``priority - aging_rate *
  arrival``), and every node is woken (``NOTIFY``). A node claims with
  :func:`yard.cluster.policy.hungry` on its own engine's snapshot and the registry:
  one job at a time, each claim a round trip, the best-ranked job among the
  backends it asked for. The claimed job enters its core with its original arrival
  time and deadline.
- **Listener chat** is synchronous: it reaches a host drawn at random, which serves
  it or forwards it (one hop's latency) as :func:`yard.cluster.policy.route` says,
  from the registry (its own row included).
- **The registry**: each node publishes what it has loaded or loading, what waits
  there and its free GPU memory every heartbeat, and at once when a backend starts,
  becomes ready or stops (after the publish's latency).

One seed, one run: the workload is the one-host day's for the same seed (so the rows
compare the same requests); each host's world and the database's latencies draw from
generators seeded from it, and Trio's scheduling is seeded as in :mod:`sim.runner`.

The figures are :func:`sim.metrics.metrics` of the two hosts taken together, judged
against the two-GPU machine's lower bounds (one instance of each model for both
GPUs). What is not counted: a GPU's idle time while a job waits unclaimed in the
shared queue (the ledger of a host sees a job only once it is claimed there).
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

import trio
import trio.testing

from sim import scenarios
from sim.runner import (
    RequestRecord,
    SimResult,
    _deterministic_trio,
    _Recorder,
    make_policy,
    stored_profile,
)
from sim.workload import Arrival, Scenario
from sim.world import MiB, SimWorld
from yard.cluster.policy import Hunger, Peer, hungry, local_backends, route
from yard.core import views
from yard.core.decisions import Decision, Dispatch, StartBackend, StopBackend
from yard.core.events import (
    BackendExited,
    BackendReady,
    BackendStartFailed,
    BackendStopped,
    Event,
    RequestFinished,
)
from yard.core.spec import Profile
from yard.core.views import Snapshot
from yard.engine import Admission, Engine
from yard.errors import Rejected

JOB_APPS = frozenset({"newsroom", "art", "music"})
"""The radio day's apps that hand their work in as jobs; the others (listener chat)
send synchronous requests."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    """Seconds each trip to the shared database takes (each draw varies uniformly by
    ``jitter``, a fraction, around it), and the registry's heartbeat.

    insert_s: handing a job in (insert + ``NOTIFY`` in one transaction).
    notify_s: from the commit to the other nodes' wake-up.
    claim_s: one claim (``SELECT ... FOR UPDATE SKIP LOCKED`` and the update).
    publish_s: one registry upsert.
    forward_s: a synchronous request's hop to another node.
    """

    insert_s: float = 0.003
    notify_s: float = 0.001
    claim_s: float = 0.004
    publish_s: float = 0.002
    forward_s: float = 0.001
    jitter: float = 0.5
    heartbeat_s: float = 2.0

    def draw(self, rng: random.Random, base: float) -> float:
        return base * (1 + self.jitter * (2 * rng.random() - 1))


@dataclass(slots=True)
class Job:
    """One job of the shared queue, and what became of it."""

    record: RequestRecord
    rank: float
    seq: int
    origin: str
    inserted_at: float = math.nan
    claimed_at: float | None = None
    claimed_by: str = ""


class SharedQueue:
    """The jobs table: unclaimed jobs by backend, best rank first (then arrival)."""

    def __init__(self) -> None:
        self._heaps: dict[str, list[tuple[float, int, Job]]] = {}

    def insert(self, job: Job) -> None:
        heap = self._heaps.setdefault(job.record.arrival.backend, [])
        heapq.heappush(heap, (-job.rank, job.seq, job))

    def __bool__(self) -> bool:
        return any(self._heaps.values())

    def any_for(self, backends: tuple[str, ...]) -> bool:
        return any(self._heaps.get(b) for b in backends)

    def claim(self, node: str, hunger: Hunger, now: float) -> Job | None:
        """The best-ranked unclaimed job among ``hunger.claim``; ties in rank go to
        ``hunger.prefer``, then to the earlier job (the contract's claim)."""
        best: tuple[float, bool, int, str] | None = None
        for backend in hunger.claim:
            heap = self._heaps.get(backend)
            if heap:
                neg_rank, seq, _ = heap[0]
                key = (neg_rank, backend not in hunger.prefer, seq, backend)
                if best is None or key < best:
                    best = key
        if best is None:
            return None
        _, _, job = heapq.heappop(self._heaps[best[3]])
        job.claimed_at = now
        job.claimed_by = node
        return job


@dataclass(frozen=True, slots=True, kw_only=True)
class Published:
    """One node's row in the registry."""

    name: str
    serves: frozenset[str]
    loaded: frozenset[str]
    ready: frozenset[str]
    loading: frozenset[str]
    waiting: Mapping[str, int] = field(hash=False)
    free_mib: float

    def peer(self) -> Peer:
        return Peer(
            name=self.name,
            serves=self.serves,
            ready=self.ready,
            loading=self.loading,
            waiting=self.waiting,
            free_mib=self.free_mib,
        )


class Host:
    """One yard node: a simulated machine with its own engine and core."""

    def __init__(
        self,
        name: str,
        gpu: str,
        scenario: Scenario,
        rng: random.Random,
        stored: Mapping[str, Profile],
        keep_log: bool,
    ) -> None:
        total = dict(scenario.machine.gpus)[gpu]
        self.name = name
        self.models = tuple(replace(m, gpus=(gpu,)) for m in scenario.models)
        self.scenario = replace(
            scenario,
            name=f"{scenario.name}-{name}",
            machine=replace(scenario.machine, gpus=((gpu, total),)),
            models=self.models,
        )
        self.world = SimWorld(self.scenario.machine, self.models, rng, stored_profiles=stored)
        self.recorder = _Recorder(make_policy("yard", self.scenario), keep_log)
        load_s = {m.name: m.load_s for m in self.models}
        self.engine = Engine(
            scheduler=self.recorder,
            launcher=self.world,
            meter=self.world,
            profiles=self.world,
            logs=self.world,
            start_timeout_s=lambda backend: max(60.0, 5 * load_s.get(backend, 60.0)),
            meter_interval_s=scenario.meter_interval_s,
            profile_interval_s=0.25,
        )
        self.gpus_of = {m.name: m.gpus for m in self.models}
        self.margin = scenario.config.profile_margin
        self.wake = trio.Event()
        self.dirty = trio.Event()
        self.claims = 0
        self.served = 0
        # Bumped by every event and decision: a snapshot is rebuilt only when the core
        # may have changed since the last one (they are the costly part of a run).
        self.version = 0
        self.queue: SharedQueue | None = None
        self._snapshot: tuple[int, Snapshot] | None = None
        self.engine.watch(self._watch)

    def snapshot(self) -> Snapshot:
        """The core's devices and backends (no queue), rebuilt only after it moved."""
        if self._snapshot is None or self._snapshot[0] != self.version:
            self._snapshot = (self.version, _devices_and_backends(self.recorder.policy))
        return self._snapshot[1]

    def _watch(self, at: float, item: Event | Decision) -> None:
        self.version += 1
        kind = type(item)
        if kind in _CHANGES:
            self.dirty.set()
            self.wake.set()
        elif (kind is RequestFinished or kind is Dispatch) and self.queue:
            # A slot freed or a job started: the claim loop looks again, when there
            # is something to claim.
            self.wake.set()

    def published(self) -> Published:
        snap = self.snapshot()
        ready = frozenset(b.name for b in snap.backends if b.state == "ready")
        loading = frozenset(b.name for b in snap.backends if b.state == "starting")
        free = max((d.free_bytes for d in snap.devices if d.kind == "gpu"), default=0)
        return Published(
            name=self.name,
            serves=frozenset(self.gpus_of),
            loaded=ready
            | loading
            | frozenset(b.name for b in snap.backends if b.state == "draining"),
            ready=ready,
            loading=loading,
            waiting={b.name: b.queued for b in snap.backends if b.queued},
            free_mib=free / MiB,
        )


def _devices_and_backends(policy: object) -> Snapshot:
    """What ``Engine.snapshot(limit=0)`` returns, without the queue's dispatch order.

    ``Scheduler.snapshot`` sorts the whole queue even when asked for none of it
    (O(n log n) per call); in a day when the chat queue grows long that was most of
    this simulation's time. The devices and backends are built here the way it
    builds them, from the same view functions.
    """
    scheduler = cast(Any, policy)
    core = scheduler._core
    return Snapshot(
        now=0.0,
        devices=tuple(views.device_view(dev, core.occupants(d)) for d, dev in core.devices.items()),
        backends=tuple(
            views.backend_view(b, scheduler.profile(b.name)) for b in core.backends.values()
        ),
        queue=(),
        queue_length=core.queued,
    )


_CHANGES = frozenset(
    {StartBackend, StopBackend, BackendReady, BackendStopped, BackendExited, BackendStartFailed}
)


@dataclass(slots=True, kw_only=True)
class ClusterRun:
    """A two-host day: the figures' input (``result``, both hosts together) and what
    only a cluster has.

    jobs: every job of the shared queue, with where and when it was claimed.
    forwarded: synchronous requests served by another host than the one they reached.
    claims: jobs claimed, per host. served: requests dispatched, per host.
    """

    result: SimResult
    jobs: list[Job]
    forwarded: int
    claims: dict[str, int]
    served: dict[str, int]


def cluster_scenario(hours: float = 24.0) -> Scenario:
    """The radio day on the two-GPU machine: its workload, its models and the lower
    bounds the two hosts are judged by (gpu0 is host a's GPU, gpu1 host b's)."""
    return scenarios.radio_day(2, hours)


def run_cluster(
    hours: float = 24.0,
    seed: int | None = None,
    *,
    scenario: Scenario | None = None,
    latency: Latency | None = None,
    keep_log: bool = False,
) -> ClusterRun:
    """Simulate the two-host radio day (``hours`` from midnight) with ``seed``
    (default: the radio day's).

    scenario: another workload instead (tests): one host per GPU of its machine,
        requests of :data:`JOB_APPS` as jobs, the others synchronous.
    """
    scenario = scenario or cluster_scenario(hours)
    seed = scenario.seed if seed is None else seed
    rng = random.Random(seed)
    arrivals = scenario.workload(rng)
    _deterministic_trio(rng.getrandbits(64))
    started = time.perf_counter()
    try:
        run = trio.run(
            _simulate,
            scenario,
            seed,
            rng,
            arrivals,
            latency or Latency(),
            keep_log,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )
    except BaseException:
        print(f"cluster simulation failed: hours={hours} seed={seed}")
        raise
    run.result.wall_s = time.perf_counter() - started
    return run


async def _simulate(
    scenario: Scenario,
    seed: int,
    rng: random.Random,
    arrivals: list[Arrival],
    latency: Latency,
    keep_log: bool,
) -> ClusterRun:
    stored = {m.name: stored_profile(m) for m in scenario.models}
    gpus = [name for name, _ in scenario.machine.gpus]
    hosts = [
        Host(chr(ord("a") + i), gpu, scenario, random.Random(rng.getrandbits(64)), stored, keep_log)
        for i, gpu in enumerate(gpus)
    ]
    by_name = {h.name: h for h in hosts}
    db_rng = random.Random(rng.getrandbits(64))
    need_mib = {
        m.name: m.peak_gpu_bytes * scenario.config.profile_margin / MiB for m in scenario.models
    }
    aging = scenario.config.aging_rate
    queue = SharedQueue()
    for host in hosts:
        host.queue = queue
    registry: dict[str, Published] = {}
    records: list[RequestRecord] = []
    jobs: list[Job] = []
    forwarded = 0
    ended = 0
    all_ended = trio.Event()

    def done(record: RequestRecord, outcome: str, code: str = "") -> None:
        nonlocal ended
        record.end(outcome, code)
        ended += 1
        if ended == len(arrivals):
            all_ended.set()

    async def serve(host: Host, admission: Admission, record: RequestRecord) -> None:
        """The client's side once its request is in ``host``'s core (as in sim.runner)."""
        arrival = record.arrival
        ledger = host.world.ledger
        waiting = True
        patience = math.inf if arrival.cancel_after_s is None else arrival.cancel_after_s
        with trio.move_on_at(arrival.at + patience):
            while True:
                try:
                    assignment = await admission.wait_dispatched()
                except Rejected as exc:
                    if waiting:
                        ledger.wait(arrival.backend, -1)
                    done(record, "rejected", exc.code)
                    return
                record.dispatches.append(trio.current_time())
                host.served += 1
                if waiting:
                    ledger.wait(arrival.backend, -1)
                    waiting = False
                if await host.world.serve(assignment.base_url, arrival.service_s):
                    admission.report("ok")
                    done(record, "ok")
                    return
                admission.report("upstream_lost", "connection reset by peer")
                ledger.wait(arrival.backend, +1)
                waiting = True
        admission.cancel()
        if waiting:
            ledger.wait(arrival.backend, -1)
        done(record, "cancelled")

    def submit(host: Host, record: RequestRecord) -> Admission:
        arrival = record.arrival
        admission = host.engine.submit(
            backend=arrival.backend,
            priority=arrival.priority,
            app=arrival.app,
            request_id=arrival.request_id,
            start_by=arrival.start_by,
            allow_late=arrival.allow_late,
            arrived_at=arrival.at,
        )
        host.world.ledger.wait(arrival.backend, +1)
        return admission

    def others(host: Host) -> list[Published]:
        return [p for name, p in sorted(registry.items()) if name != host.name]

    def hunger(host: Host) -> Hunger:
        local = local_backends(host.snapshot(), gpus_of=host.gpus_of, margin=host.margin)
        rest = others(host)
        loaded = frozenset().union(*(p.loaded for p in rest))
        room = frozenset(b for b, need in need_mib.items() if any(p.free_mib >= need for p in rest))
        return hungry(local, loaded_elsewhere=loaded, room_elsewhere=room)

    async def claimer(host: Host, clients: trio.Nursery) -> None:
        while True:
            if queue:
                with trio.move_on_after(latency.heartbeat_s):
                    await host.wake.wait()
            else:
                # Nothing to claim: the next job's NOTIFY wakes every node (the
                # heartbeat's claim would find nothing).
                await host.wake.wait()
            host.wake = trio.Event()
            # A claim that would find nothing is skipped (it would cost only time).
            while queue:
                want = hunger(host)
                if not want or not queue.any_for(want.claim):
                    break
                await trio.sleep(latency.draw(db_rng, latency.claim_s))
                job = queue.claim(host.name, want, trio.current_time())
                if job is None:
                    break
                host.claims += 1
                clients.start_soon(serve, host, submit(host, job.record), job.record)

    async def publisher(host: Host) -> None:
        seen = -1
        while True:
            # A heartbeat after which nothing changed would write the same row again.
            if host.version != seen:
                seen = host.version
                state = host.published()
                await trio.sleep(latency.draw(db_rng, latency.publish_s))
                before = registry.get(host.name)
                registry[host.name] = state
                if before is None or (before.loaded, before.free_mib) != (
                    state.loaded,
                    state.free_mib,
                ):
                    for other in hosts:  # NOTIFY yard_nodes
                        if other is not host:
                            other.wake.set()
            with trio.move_on_after(latency.heartbeat_s):
                await host.dirty.wait()
            host.dirty = trio.Event()

    async def hand_in_job(record: RequestRecord, origin: Host) -> None:
        arrival = record.arrival
        job = Job(
            record=record,
            rank=arrival.priority - aging * arrival.at,
            seq=len(jobs),
            origin=origin.name,
        )
        jobs.append(job)
        await trio.sleep(latency.draw(db_rng, latency.insert_s))
        job.inserted_at = trio.current_time()
        queue.insert(job)
        await trio.sleep(latency.draw(db_rng, latency.notify_s))
        for host in hosts:
            host.wake.set()

    async def synchronous(record: RequestRecord, origin: Host) -> None:
        nonlocal forwarded
        model = record.arrival.backend
        # From the registry, this node's own row too: what it has loaded is published
        # at once when it changes; only its queue counts may be a heartbeat old.
        peers = [p.peer() for _, p in sorted(registry.items())]
        where = route(model, peers, origin.name, need_mib=need_mib.get(model))
        target = origin
        if where.forward:
            forwarded += 1
            target = by_name[where.node]
            await trio.sleep(latency.draw(db_rng, latency.forward_s))
        await serve(target, submit(target, record), record)

    async with trio.open_nursery() as root:
        for host in hosts:
            await root.start(host.world.run)
            await root.start(host.engine.run)
        for host in hosts:
            root.start_soon(publisher, host)
        with trio.move_on_at(scenario.horizon_s):
            async with trio.open_nursery() as clients:
                for host in hosts:
                    root.start_soon(claimer, host, clients)
                for arrival in arrivals:
                    if arrival.at > trio.current_time():
                        await trio.sleep_until(arrival.at)
                    ready = any(h.world.ready(arrival.backend) for h in hosts)
                    record = RequestRecord(arrival, ready_at_arrival=ready)
                    records.append(record)
                    origin = hosts[rng.randrange(len(hosts))]
                    if arrival.app in JOB_APPS:
                        clients.start_soon(hand_in_job, record, origin)
                    else:
                        clients.start_soon(synchronous, record, origin)
                await all_ended.wait()
        end_time = trio.current_time()
        for host in hosts:
            host.world.ledger.close()
        stats = [h.engine.statistics() for h in hosts]
        root.cancel_scope.cancel()

    digest = hashlib.sha256()
    for host in hosts:
        digest.update(host.recorder.hash.digest())
    first = stats[0]
    statistics = replace(
        first,
        loads=sum(s.loads for s in stats),
        requeues=sum(s.requeues for s in stats),
        ooms=sum(s.ooms for s in stats),
        events=sum(s.events for s in stats),
        decisions=sum(s.decisions for s in stats),
        submitted=sum(s.submitted for s in stats),
    )
    gpu_seconds: dict[str, dict[str, float]] = {}
    for host in hosts:
        gpu_seconds.update(host.world.ledger.seconds)
    result = SimResult(
        scenario=scenario,
        policy="yard-2-hosts",
        seed=seed,
        records=records,
        log_digest=digest.hexdigest(),
        log=[line for h in hosts for line in (h.recorder.lines or [])] if keep_log else None,
        dispatch_order=sorted(d for h in hosts for d in h.recorder.dispatches),
        launches=sorted(launch for h in hosts for launch in h.world.launches),
        ooms=[oom for h in hosts for oom in h.world.ooms],
        gpu_seconds=gpu_seconds,
        statistics=statistics,
        faults=[],
        end_time=end_time,
        wall_s=0.0,
    )
    return ClusterRun(
        result=result,
        jobs=jobs,
        forwarded=forwarded,
        claims={h.name: h.claims for h in hosts},
        served={h.name: h.served for h in hosts},
    )


# -- the report: one host and two hosts side by side ----------------------------------

MACHINES = ("1 host, 1 GPU", "1 host, 2 GPUs", "2 hosts, 1 GPU each")


def measure(job: tuple[str, int, float]) -> tuple[str, int, dict[str, float]]:
    """Run one machine's radio day (``hours`` from midnight) with one seed and return
    its figures (:func:`sim.metrics.metrics`; the two-host day adds ``forwarded``
    and ``claims``). For a process pool: plain arguments, plain results."""
    from sim.metrics import metrics
    from sim.runner import run

    machine, seed, hours = job
    if machine == MACHINES[2]:
        day = run_cluster(hours, seed)
        row = metrics(day.result)
        row["forwarded"] = day.forwarded
        row["claims"] = sum(day.claims.values())
        return machine, seed, row
    gpus = 1 if machine == MACHINES[0] else 2
    return machine, seed, metrics(run(scenarios.radio_day(gpus, hours), "yard", seed))


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def table(
    seeds: list[int],
    hours: float = 24.0,
    jobs: int = 1,
    known: Mapping[tuple[str, int], dict[str, float]] | None = None,
) -> str:
    """Issue 13's targets for the two-host radio day (0 OOMs, every feasible deadline
    met, loads within 1.2x the lower bound), with the one-host days of the same
    seeds beside it, as a Markdown table.

    known: rows already measured, by (machine, seed) (``python -m sim targets``
    has the one-host days already).
    """
    import concurrent.futures

    found: dict[tuple[str, int], dict[str, float]] = dict(known or {})
    work = [
        (machine, seed, hours)
        for seed in seeds
        for machine in MACHINES
        if (machine, seed) not in found
    ]
    # The two-host day is the longest: first, so that the pool ends together.
    work.sort(key=lambda job: job[0] != MACHINES[2])
    if jobs > 1:
        with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
            for machine, seed, row in pool.map(measure, work):
                found[(machine, seed)] = row
    else:
        for job in work:
            machine, seed, row = measure(job)
            found[(machine, seed)] = row
    lines = [
        "| machine | seed | OOMs | feasible deadlines met | loads / LB | high p95 s "
        "| normal p95 s | forwarded / claimed | requests in wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for seed in seeds:
        for machine in MACHINES:
            row = found[(machine, seed)]
            feasible = row["deadlines_met"] + row["deadlines_missed_avoidable"]
            bound = row["loads_lower_bound"]
            ratio = row["loads"] / bound if bound else math.inf
            cluster = f"{row['forwarded']:.0f} / {row['claims']:.0f}" if "forwarded" in row else "-"
            cells = [
                machine,
                str(seed),
                f"{row['ooms']:.0f} {_mark(row['ooms'] == 0)}",
                f"{row['deadlines_met']:.0f}/{feasible:.0f} "
                f"{_mark(row['deadlines_missed_avoidable'] == 0)}",
                f"{row['loads']:.0f}/{bound:.0f} = {ratio:.2f} {_mark(ratio <= 1.2)}",
                f"{row['high_wait_p95_s']:.0f}",
                f"{row['normal_wait_p95_s']:.1f}",
                cluster,
                f"{row['requests']:.0f} in {row['wall_s']:.0f} s",
            ]
            if row["stuck"]:
                cells[-1] += f", {row['stuck']:.0f} STUCK"
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
