"""Several instances under random load and random operators: pins, loads and
unloads of single instances come in among the requests, before and after the
first load has measured the profile the instances share. The core's promises
hold, no further instance takes a first load, and the incremental planning
agrees with planning everything afresh."""

from __future__ import annotations

import heapq
import itertools
import random

import pytest

from tests.core.harness import GIB, gpu, host
from tests.core.test_instances_random import BACKENDS, PROFILES, SERVICE, play_twins
from yard.core import (
    Decision,
    Dispatch,
    Event,
    ProfileMeasured,
    Reject,
    RequestArrived,
    Scheduler,
    SchedulerConfig,
    StartBackend,
)
from yard.core.events import AdminLoad, AdminPin, AdminUnload

NEWS = ("news", "news@2", "news@3")


def _operator(rng: random.Random) -> Event:
    name = rng.choice(NEWS)
    kind = rng.choice(["pin", "unpin", "load", "unload"])
    if kind == "load":
        return AdminLoad(backend=name)
    if kind == "unload":
        return AdminUnload(backend=name)
    return AdminPin(backend=name, pinned=kind == "pin")


def run_day(seed: int) -> tuple[list[tuple[float, Decision]], int]:
    """Two random hours, news measured on its first load; the decisions and how
    many requests arrived."""
    rng = random.Random(seed)
    devices = (gpu("gpu0"), gpu("gpu1"), host())
    config = SchedulerConfig(default_service_s=30.0)
    s = Scheduler(devices, BACKENDS, config)
    reference = Scheduler(devices, BACKENDS, config, replan_everything=True)
    seq = itertools.count()
    pending: list[tuple[float, int, Event]] = []
    for name, (g, h, load) in PROFILES.items():
        if name != "news":  # news is measured by its first load
            stored = ProfileMeasured(
                backend=name, gpu_bytes=g * GIB, host_bytes=h * GIB, load_s=load, source="stored"
            )
            heapq.heappush(pending, (0.0, next(seq), stored))
    service: dict[str, float] = {}
    arrivals = 0
    for i in range(rng.randint(20, 50)):
        backend = rng.choice(["news", "news", "news@2", "chat", "music"])
        rid = f"r{i:03d}"
        service[rid] = SERVICE[backend.partition("@")[0]] * rng.uniform(0.5, 1.5)
        arrival = RequestArrived(request_id=rid, backend=backend, priority=rng.choice([10, 90]))
        heapq.heappush(pending, (rng.uniform(0, 7200.0), next(seq), arrival))
        arrivals += 1
    for _ in range(rng.randint(5, 20)):
        heapq.heappush(pending, (rng.uniform(0, 7200.0), next(seq), _operator(rng)))
    # Everything unpinned at the end, so that the day ends.
    for name in NEWS:
        heapq.heappush(pending, (7300.0, next(seq), AdminPin(backend=name, pinned=False)))
    return play_twins(s, reference, pending, seq, service), arrivals


@pytest.mark.parametrize("seed", range(12))
def test_random_operators_keep_the_promises_with_instances(seed: int) -> None:
    log, arrivals = run_day(seed)
    ended: dict[str, int] = {}
    for _, d in log:
        if isinstance(d, Dispatch | Reject) and d.request_id is not None:
            ended[d.request_id] = ended.get(d.request_id, 0) + 1
    assert sum(ended.values()) == arrivals == len(ended), "each request ends exactly once"
    # Only the first instance measures; a request sent to news@2 by name before
    # that may load it (it is bound there), nothing else may.
    measured = [d.backend for _, d in log if isinstance(d, StartBackend) and d.measure]
    named = {"news@2"}
    assert set(measured) <= {"news", "chat", "music"} | named, measured
