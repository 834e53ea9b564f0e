"""The core's cost per event with 100, 1,000 and 10,000 requests waiting.

A seeded mix of the events a busy yard sees (arrivals, finishes, ticks at
``next_wakeup()``, meter readings, backends loading and stopping) is fed to one
``Scheduler`` while the queue is held at the target length; every ``handle()``
call is timed. Several backends share two GPUs and host memory, so swaps,
drains and evictions happen along the way. Target: median under 50 us at
10,000 waiting, and figures that grow slowly with the queue.

The model-zoo case: 10, 25 and 50 backends on two GPUs where one fits per GPU,
most with requests waiting, a quarter of arrivals with a start-by, 10,000 waiting.
Every event may change which backend should be loaded next, so it shows how the
cost of planning grows with the number of configured backends. Then 40 backends
with 100, 1,000 and 10,000 waiting and the mix a real meter and real clients give
(:class:`_Bench` ``varied``): each reading reports every loaded backend's live use
(below its profile, moving with its traffic: a reading changes what planning
reads), now and then a backend above its profile (its profile is raised), foreign
use that comes and goes, loads reported while they run (``BackendLoading``), and
clients that give up (``RequestCancelled``). Target: median under 50 us and p99
under 500 us at every queue length.

Where the compiled core runs (:mod:`yard.compiled`), every case runs first on
the plain-Python core (``YARD_CORE=pure``, in a subprocess): the baseline, in the
same run.

Run: ``python -m sim bench`` (or ``python -m sim.bench_core``);
``python -m sim.bench_core kinds`` splits the varied mix by event type.
"""

from __future__ import annotations

import heapq
import itertools
import os
import random
import statistics
import subprocess
import sys
import time

from yard import compiled
from yard.core import (
    HOST,
    BackendLoading,
    BackendReady,
    BackendSpec,
    BackendStopped,
    Decision,
    DeviceSpec,
    Dispatch,
    Event,
    MemoryMeasured,
    ProfileMeasured,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    Scheduler,
    SchedulerConfig,
    StartBackend,
    StopBackend,
    Tick,
)

GIB = 1024**3
SIZES = (100, 1_000, 10_000)
TIMED_EVENTS = 20_000
SEED = 7

DEVICES = (
    DeviceSpec(name="gpu0", kind="gpu", total_bytes=24 * GIB, reserve_bytes=GIB),
    DeviceSpec(name="gpu1", kind="gpu", total_bytes=24 * GIB, reserve_bytes=GIB),
    DeviceSpec(name=HOST, kind="host", total_bytes=64 * GIB, reserve_bytes=4 * GIB),
)
# name: gpus, slots, (gpu GiB, host GiB, load s), mean service s, share of arrivals
BACKENDS: dict[str, tuple[tuple[str, ...], int, tuple[int, int, float], float, int]] = {
    "chat": (("gpu0", "gpu1"), 4, (9, 2, 6.0), 3.0, 40),
    "code": (("gpu0",), 2, (12, 2, 9.0), 6.0, 15),
    "big": (("gpu1",), 1, (18, 4, 25.0), 20.0, 5),
    "tts": (("gpu0", "gpu1"), 2, (3, 1, 2.0), 1.5, 20),
    "embed": (("gpu0", "gpu1"), 8, (1, 1, 1.0), 0.2, 15),
    "cpu": ((), 2, (0, 6, 3.0), 4.0, 5),
}


_Backends = dict[str, tuple[tuple[str, ...], int, tuple[int, int, float], float, int]]

ZOO_SIZES = (10, 25, 50)
ZOO_QUEUED = 10_000
ZOO_DEADLINE_SHARE = 0.25
VARIED_BACKENDS = 40
VARIED_READING_SHARE = 0.1  # of events: a reading of one device
VARIED_CANCEL_SHARE = 0.05  # of arrivals: the client gives up while it waits
VARIED_ABOVE_SHARE = 0.02  # of readings: a backend above its profile


def zoo(count: int) -> _Backends:
    """``count`` models on both GPUs, 14 GiB each (one fits per 24 GiB GPU), with
    load and service times and a popularity (a long tail) drawn from a fixed seed."""
    rng = random.Random(count)
    return {
        f"m{i:02d}": (
            ("gpu0", "gpu1"),
            rng.choice((1, 2, 4)),
            (14, 2, round(rng.uniform(4.0, 30.0), 1)),
            round(rng.uniform(1.0, 12.0), 1),
            max(1, round(100 / (i + 1) ** 0.7)),
        )
        for i in range(count)
    }


class _Bench:
    def __init__(
        self,
        queued: int,
        rng: random.Random,
        backends: _Backends = BACKENDS,
        deadline_share: float = 0.1,
        varied: bool = False,
    ) -> None:
        self.rng = rng
        self.backends = backends
        self.deadline_share = deadline_share
        self.varied = varied
        self.profile_gpu = {n: p[0] * GIB for n, (_g, _s, p, _svc, _w) in backends.items()}
        self.foreign = {d.name: 0 for d in DEVICES}
        specs = [
            BackendSpec(name=n, gpus=g, slots=s, idle_ttl_s=300.0)
            for n, (g, s, _p, _svc, _w) in backends.items()
        ]
        self.s = Scheduler(
            DEVICES, specs, SchedulerConfig(queue_limit=queued * 2 + 100, batch_bound=4)
        )
        self.now = 0.0
        self.engine: list[tuple[float, int, Event]] = []
        self.seq = itertools.count()
        self.ids = itertools.count()
        self.target = queued
        self.timings: list[float] = []  # CPU time of this thread, us
        self.walls: list[float] = []  # wall time, us (includes being preempted)
        self.kinds: list[str] = []  # the type of each timed event
        self.timing = False
        self.names = list(backends)
        self.weights = [w for (_g, _s, _p, _svc, w) in backends.values()]
        for name, (_g, _s, (gpu, hst, load), _svc, _w) in backends.items():
            self.feed(
                ProfileMeasured(
                    backend=name,
                    gpu_bytes=gpu * GIB,
                    host_bytes=hst * GIB,
                    load_s=load,
                    source="stored",
                )
            )
        self.loaded: dict[str, tuple[str, ...]] = {}

    def feed(self, event: Event) -> None:
        if self.timing:
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            out = self.s.handle(event, self.now)
            self.walls.append((time.perf_counter_ns() - t0) / 1000)
            self.timings.append((time.thread_time_ns() - c0) / 1000)
            self.kinds.append(type(event).__name__)
        else:
            out = self.s.handle(event, self.now)
        for d in out:
            self.carry_out(d)

    def later(self, delay: float, event: Event) -> None:
        heapq.heappush(self.engine, (self.now + delay, next(self.seq), event))

    def carry_out(self, d: Decision) -> None:
        if isinstance(d, StartBackend):
            load_s = self.backends[d.backend][2][2]
            if self.varied:
                self.later(load_s / 2, BackendLoading(backend=d.backend, progress="50%"))
            self.later(load_s, BackendReady(backend=d.backend))
            self.loaded[d.backend] = d.gpus
        elif isinstance(d, StopBackend):
            self.loaded.pop(d.backend, None)
            self.later(1.0, BackendStopped(backend=d.backend))
        elif isinstance(d, Dispatch):
            mean = self.backends[d.backend][3]
            self.later(self.rng.expovariate(1 / mean), RequestFinished(request_id=d.request_id))

    def arrive(self) -> None:
        rid = f"r{next(self.ids)}"
        deadline = self.rng.random() < self.deadline_share
        start_by = self.now + self.rng.uniform(60, 3_600) if deadline else None
        if self.varied and self.rng.random() < VARIED_CANCEL_SHARE:
            self.later(self.rng.uniform(1.0, 120.0), RequestCancelled(request_id=rid))
        self.feed(
            RequestArrived(
                request_id=rid,
                backend=self.rng.choices(self.names, self.weights)[0],
                priority=self.rng.choice((10, 30, 50, 70, 90)),
                start_by=start_by,
                allow_late=True,
            )
        )

    def reading(self) -> None:
        if self.varied:
            self.varied_reading()
            return
        dev = self.rng.choice(DEVICES)
        backends = tuple(
            (n, int(self.backends[n][2][1 if dev.name == HOST else 0]) * GIB)
            for n, gpus in sorted(self.loaded.items())
            if dev.name == HOST or dev.name in gpus
        )
        used = sum(b for _, b in backends) + self.rng.randrange(0, 2 * GIB)
        self.feed(MemoryMeasured(device=dev.name, used_bytes=used, backends=backends))

    def varied_reading(self) -> None:
        """A GPU's reading as a real meter gives it: each loaded backend's live use
        below its profile and moving with its traffic, now and then one above it,
        foreign use that comes and goes."""
        rng = self.rng
        dev = rng.choice(DEVICES[:2])
        backends = []
        for n, gpus in sorted(self.loaded.items()):
            if dev.name not in gpus:
                continue
            live = int(self.profile_gpu[n] * rng.uniform(0.85, 1.0))
            if rng.random() < VARIED_ABOVE_SHARE:
                live = int(self.profile_gpu[n] * rng.uniform(1.0, 1.02))
                self.profile_gpu[n] = max(self.profile_gpu[n], live)
            backends.append((n, live))
        if rng.random() < 0.2:
            self.foreign[dev.name] = rng.choice((0, 0, GIB // 2, GIB))
        used = sum(b for _, b in backends) + self.foreign[dev.name]
        self.feed(MemoryMeasured(device=dev.name, used_bytes=used, backends=tuple(backends)))

    def step(self) -> None:
        """One event: whichever comes first of engine report, wakeup, or new traffic."""
        queued = self.s.queue_length()
        if queued < self.target:
            self.arrive()
            return
        roll = self.rng.random()
        if roll < (VARIED_READING_SHARE if self.varied else 0.05):
            self.reading()
            return
        wake = self.s.next_wakeup()
        nxt = self.engine[0][0] if self.engine else None
        if wake is not None and (nxt is None or wake < nxt):
            self.now = max(self.now, wake)
            self.feed(Tick())
        elif nxt is not None:
            t, _, event = heapq.heappop(self.engine)
            self.now = max(self.now, t)
            self.feed(event)
        else:
            self.now += 1.0
            self.feed(Tick())

    def views(self) -> tuple[float, float]:
        """Milliseconds for one snapshot, microseconds per explain() after it."""
        self.feed(Tick())  # a fresh event: nothing cached
        t0 = time.thread_time_ns()
        snap = self.s.snapshot(self.now)
        snap_ms = (time.thread_time_ns() - t0) / 1e6
        ids = [q.request_id for q in snap.queue[:100]]
        t0 = time.thread_time_ns()
        for rid in ids:
            self.s.explain(rid, self.now)
        explain_us = (time.thread_time_ns() - t0) / 1000 / max(1, len(ids))
        return snap_ms, explain_us

    def run(self) -> tuple[list[float], list[float]]:
        for _ in range(self.target + 2_000):  # fill and warm up
            self.step()
        self.timing = True
        while len(self.timings) < TIMED_EVENTS:
            self.step()
        return self.timings, self.walls


def _row(label: int, cpu: list[float], wall: list[float]) -> str:
    q = statistics.quantiles(cpu, n=100)
    w = statistics.quantiles(wall, n=100)
    return (
        f"{label:>7} {len(cpu):>7} {statistics.median(cpu):>10.1f} {q[89]:>8.1f} "
        f"{q[98]:>8.1f} {max(cpu):>8.0f} {statistics.median(wall):>9.1f} {w[98]:>9.1f}"
    )


_HEADER = (
    f"{'median us':>10} {'p90 us':>8} {'p99 us':>8} {'max us':>8} {'wall med':>9} {'wall p99':>9}"
)


TARGET_MEDIAN_US = 50.0
"""Issue 27's target for the median: ``kinds`` tells, per event type, how many
are under it (the median of all is under it once half of all the events are)."""


def by_kind(
    cpu: list[float], kinds: list[str]
) -> list[tuple[str, int, float, float, float, int, float]]:
    """Per event type, most CPU time first: (type, events, median us, mean us,
    share of all the CPU time, events above the p99 of all, share of its
    events under :data:`TARGET_MEDIAN_US`)."""
    p99 = statistics.quantiles(cpu, n=100)[98]
    total = sum(cpu)
    groups: dict[str, list[float]] = {}
    for kind, t in zip(kinds, cpu, strict=True):
        groups.setdefault(kind, []).append(t)
    rows = [
        (
            kind,
            len(ts),
            statistics.median(ts),
            statistics.mean(ts),
            sum(ts) / total,
            sum(1 for t in ts if t > p99),
            sum(1 for t in ts if t < TARGET_MEDIAN_US) / len(ts),
        )
        for kind, ts in groups.items()
    ]
    return sorted(rows, key=lambda row: -row[4])


def main(cases: str = "all") -> None:
    """Print per-event cost of ``Scheduler.handle`` at three queue lengths, then
    for the model zoo at three numbers of backends, then for 40 backends with the
    varied mix at three queue lengths (``cases``: ``all``, ``queue``, ``zoo`` (the
    zoo and the varied mix), ``varied``, or ``kinds``: the varied mix per event
    type, which types make the median and which the p99)."""
    if cases not in ("all", "queue", "zoo", "varied", "kinds"):
        raise SystemExit(f"unknown case {cases!r}: all, queue, zoo, varied or kinds")
    compiled_core, core = compiled.ACTIVE
    print(f"core: {core}", flush=True)
    if compiled_core:
        # the baseline, in the same run: the same cases on the plain-Python core
        print("the same on the plain-Python core (YARD_CORE=pure), the baseline:", flush=True)
        env = {**os.environ, compiled.ENV: "pure"}
        subprocess.run([sys.executable, "-m", "sim.bench_core", cases], env=env, check=True)
        print("and on the compiled core:", flush=True)
    if cases == "kinds":
        _varied_case(per_kind=True)
        return
    if cases in ("all", "queue"):
        _queue_case()
    if cases in ("all", "zoo"):
        _zoo_case()
    if cases in ("all", "zoo", "varied"):
        _varied_case()


def _queue_case() -> None:
    print("core benchmark: Scheduler.handle() per event, queue held at N waiting")
    print("(CPU time of the calling thread; wall median and p99 include preemption)")
    print(f"{'N':>7} {'events':>7} {_HEADER}")
    views: list[tuple[int, float, float]] = []
    for n in SIZES:
        bench = _Bench(n, random.Random(SEED))
        cpu, wall = bench.run()
        print(_row(n, cpu, wall))
        views.append((n, *bench.views()))
    print("views (O(n), between events): snapshot(limit=200), then explain() of 100 requests")
    for n, snap_ms, explain_us in views:
        print(f"{n:>7} snapshot {snap_ms:8.1f} ms   explain {explain_us:8.1f} us each")


def _zoo_case() -> None:
    print(
        f"model zoo: B backends on two GPUs (one fits per GPU), {ZOO_QUEUED:,} waiting, "
        f"{ZOO_DEADLINE_SHARE:.0%} of arrivals with a start-by"
    )
    print(f"{'B':>7} {'events':>7} {_HEADER}")
    for count in ZOO_SIZES:
        bench = _Bench(ZOO_QUEUED, random.Random(SEED), zoo(count), ZOO_DEADLINE_SHARE)
        cpu, wall = bench.run()
        print(_row(count, cpu, wall))


def _varied_case(*, per_kind: bool = False) -> None:
    print(
        f"model zoo, varied mix: {VARIED_BACKENDS} backends on two GPUs (one fits per GPU), "
        f"readings of live use {VARIED_READING_SHARE:.0%} of events, "
        f"{VARIED_CANCEL_SHARE:.0%} of clients give up"
    )
    print(f"{'N':>7} {'events':>7} {_HEADER}")
    for n in SIZES:
        bench = _Bench(
            n, random.Random(SEED), zoo(VARIED_BACKENDS), ZOO_DEADLINE_SHARE, varied=True
        )
        cpu, wall = bench.run()
        print(_row(n, cpu, wall))
        if per_kind:
            under = f"under {TARGET_MEDIAN_US:.0f} us"
            print(
                f"{'':>7} {'event':<18} {'events':>7} {'median us':>10} {'mean us':>8} "
                f"{'CPU share':>9} {'over p99':>8} {under:>12}"
            )
            for kind, count, median, mean, share, over, low in by_kind(cpu, bench.kinds):
                print(
                    f"{'':>7} {kind:<18} {count:>7} {median:>10.1f} {mean:>8.1f} "
                    f"{share:>9.1%} {over:>8} {low:>12.0%}"
                )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all")
