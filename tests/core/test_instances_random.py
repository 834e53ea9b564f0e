"""Several instances under random load: the core's promises still hold, and the
incremental planning agrees with planning everything afresh when requests are
bound to instances and moved between them."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Iterator

import pytest

from tests.core.harness import GIB, gpu, host
from yard.core import (
    BackendReady,
    BackendSpec,
    BackendStopped,
    Decision,
    Dispatch,
    Event,
    ProfileMeasured,
    Reject,
    RequestArrived,
    RequestFinished,
    Scheduler,
    SchedulerConfig,
    StartBackend,
    StopBackend,
    Tick,
)

BACKENDS = (
    BackendSpec(name="news", gpus=("gpu0", "gpu1"), instances=3),
    BackendSpec(name="news@2", gpus=("gpu0", "gpu1"), instances=3, instance_of="news"),
    BackendSpec(name="news@3", gpus=("gpu0", "gpu1"), instances=3, instance_of="news"),
    BackendSpec(name="chat", gpus=("gpu0", "gpu1"), slots=2, idle_ttl_s=120.0),
    BackendSpec(name="music", gpus=("gpu1",)),
)
PROFILES = {"news": (14, 2, 40.0), "chat": (4, 1, 10.0), "music": (12, 3, 30.0)}
SERVICE = {"news": 90.0, "chat": 3.0, "music": 300.0}


def run_day(seed: int) -> tuple[list[tuple[float, Decision]], int]:
    """Play a random two hours on a scheduler and a re-planning reference; return
    the decisions and how many requests arrived."""
    rng = random.Random(seed)
    devices = (gpu("gpu0"), gpu("gpu1"), host())
    config = SchedulerConfig(default_service_s=30.0)
    s = Scheduler(devices, BACKENDS, config)
    reference = Scheduler(devices, BACKENDS, config, replan_everything=True)
    seq = itertools.count()
    pending: list[tuple[float, int, Event]] = []
    for name, (g, h, load) in PROFILES.items():
        profile = ProfileMeasured(
            backend=name, gpu_bytes=g * GIB, host_bytes=h * GIB, load_s=load, source="stored"
        )
        heapq.heappush(pending, (0.0, next(seq), profile))
    service: dict[str, float] = {}
    arrivals = 0
    for i in range(rng.randint(20, 60)):
        backend = rng.choice(["news", "news", "news", "chat", "chat", "music"])
        rid = f"r{i:03d}"
        service[rid] = SERVICE[backend] * rng.uniform(0.5, 1.5)
        at = rng.uniform(0, 7200.0)
        if backend == "news" and rng.random() < 0.3:  # a script that must start in 10 min
            arrival = RequestArrived(
                request_id=rid, backend=backend, priority=90, start_by=at + 600.0
            )
        else:
            priority = rng.choice([10, 50, 90])
            arrival = RequestArrived(request_id=rid, backend=backend, priority=priority)
        heapq.heappush(pending, (at, next(seq), arrival))
        arrivals += 1
    return play_twins(s, reference, pending, seq, service), arrivals


def play_twins(
    s: Scheduler,
    reference: Scheduler,
    pending: list[tuple[float, int, Event]],
    seq: Iterator[int],
    service: dict[str, float],
) -> list[tuple[float, Decision]]:
    """Play ``pending`` (and what the decisions cause) on ``s`` and ``reference``
    until nothing is left, checking that they decide alike on every event;
    return the decisions. Backends load in their :data:`PROFILES` time (a
    measuring start also measures that profile), stop in a second, and serve
    each request in its ``service`` time."""
    log: list[tuple[float, Decision]] = []
    ready: set[str] = set()
    now = 0.0
    for _ in range(100_000):
        wake = s.next_wakeup()
        nxt = pending[0][0] if pending else None
        times = [t for t in (wake, nxt) if t is not None]
        if not times:
            return log
        now = max(now, min(times))
        event: Event = Tick()
        if nxt is not None and nxt <= now:
            event = heapq.heappop(pending)[2]
        out = s.handle(event, now)
        assert out == reference.handle(event, now), f"planning differs at {now}: {event!r}"
        if isinstance(event, BackendReady):
            ready.add(event.backend)
        for d in out:
            log.append((now, d))
            if isinstance(d, StartBackend):
                g, h, load = PROFILES[d.backend.partition("@")[0]]
                if d.measure:
                    measured = ProfileMeasured(
                        backend=d.backend, gpu_bytes=g * GIB, host_bytes=h * GIB, load_s=load
                    )
                    heapq.heappush(pending, (now + load, next(seq), measured))
                heapq.heappush(pending, (now + load, next(seq), BackendReady(backend=d.backend)))
            elif isinstance(d, StopBackend):
                ready.discard(d.backend)
                heapq.heappush(pending, (now + 1.0, next(seq), BackendStopped(backend=d.backend)))
            elif isinstance(d, Dispatch):
                assert d.backend in ready, f"dispatch to {d.backend}, not ready"
                finish = RequestFinished(request_id=d.request_id)
                heapq.heappush(pending, (now + service[d.request_id], next(seq), finish))
    raise AssertionError("the day did not end")


@pytest.mark.parametrize("seed", range(12))
def test_random_days_keep_the_promises_with_instances(seed: int) -> None:
    log, arrivals = run_day(seed)
    ended: dict[str, int] = {}
    for _, d in log:
        if isinstance(d, Dispatch | Reject) and d.request_id is not None:
            ended[d.request_id] = ended.get(d.request_id, 0) + 1
    assert sum(ended.values()) == arrivals == len(ended), "each request ends exactly once"
    for _, d in log:
        if isinstance(d, StopBackend) and d.backend.startswith("news"):
            assert "room for news" not in d.reason, d.reason


def test_the_random_days_use_a_second_instance_and_never_a_third_that_cannot_fit() -> None:
    # Two 24 GiB GPUs hold one 14 GiB copy each: news@3 never fits beside two.
    logs = [run_day(seed)[0] for seed in range(12)]
    served = {d.backend for log in logs for _, d in log if isinstance(d, Dispatch)}
    assert {"news", "news@2"} <= served
    started = {d.backend for log in logs for _, d in log if isinstance(d, StartBackend)}
    assert "news@3" not in started
