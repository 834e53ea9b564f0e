"""Incremental planning gives what planning everything afresh gives.

A round revisits only the plans an event can change (see
``yard.core.planning``). Here a seeded busy day on one GPU shared by eight
models of different sizes (swaps, drains, batching and deadlines all happen) is
fed to two schedulers, one planning incrementally and one with
``replan_everything=True``: after every event both must have decided the same
and must explain every backend and request the same way. A model zoo does the same
on two GPUs where one model fits per GPU, so that every plan has two options
and most wait behind what the plans before them claimed and took. The stateful
test in ``test_machine.py`` checks the same on Hypothesis' own histories.
"""

from __future__ import annotations

import heapq
import itertools
import random

import pytest

from yard.core import (
    HOST,
    BackendReady,
    BackendSpec,
    BackendStopped,
    DeviceSpec,
    Dispatch,
    Event,
    MemoryMeasured,
    ProfileMeasured,
    RequestArrived,
    RequestFinished,
    Scheduler,
    SchedulerConfig,
    StartBackend,
    StopBackend,
    Tick,
)

GIB = 1024**3
# name: (gpu GiB, load s, mean service s, share of arrivals)
MODELS = {
    "m0": (2.0, 8.0, 2.0, 6),
    "m1": (3.0, 12.0, 4.0, 5),
    "m2": (4.0, 15.0, 3.0, 4),
    "m3": (5.0, 10.0, 6.0, 3),
    "m4": (6.0, 20.0, 5.0, 3),
    "m5": (8.0, 25.0, 8.0, 2),
    "m6": (9.0, 18.0, 2.0, 2),
    "m7": (12.0, 30.0, 10.0, 1),
}
# Twelve models of 14 GiB: one fits on each 24 GiB GPU; host memory (3 GiB) holds
# two of them, so a load may wait for host memory too.
ZOO = {f"z{i:02d}": (14.0, 5.0 + 2 * i, 1.0 + i % 5, max(1, 12 - i)) for i in range(12)}
# Thirty such models (the bench's zoo, smaller): most plans are refused by the same
# loaded backend, so a change of its best request is read again only by the plans
# whose head ranks between its old and new one (Planner._between), and a swap's
# plan only when its victim changed in what the plan read of it.
BIG_ZOO = {f"y{i:02d}": (14.0, 4.0 + i % 9, 1.0 + i % 7, max(1, 30 - i)) for i in range(30)}


def _run_twins(
    seed: int,
    events: int,
    models: dict[str, tuple[float, float, float, int]] = MODELS,
    gpus: tuple[str, ...] = ("gpu0",),
    host_gib: float = 64,
) -> None:
    rng = random.Random(seed)
    devices = (
        *(DeviceSpec(name=g, kind="gpu", total_bytes=24 * GIB, reserve_bytes=GIB) for g in gpus),
        DeviceSpec(name=HOST, kind="host", total_bytes=int(host_gib * GIB)),
    )
    specs = [
        BackendSpec(name=n, gpus=gpus, slots=1 + i % 3, idle_ttl_s=120.0)
        for i, n in enumerate(models)
    ]
    config = SchedulerConfig(batch_bound=3, queue_limit=200, urgency_window_s=20.0)
    inc = Scheduler(devices, specs, config)
    ref = Scheduler(devices, specs, config, replan_everything=True)
    now = 0.0
    later: list[tuple[float, int, Event]] = []
    seq = itertools.count()
    ids = itertools.count()
    loaded: dict[str, tuple[str, ...]] = {}

    def feed(event: Event) -> None:
        got = inc.handle(event, now)
        want = ref.handle(event, now)
        assert got == want, f"seed {seed} at {now}: {event!r}"
        assert inc.snapshot(now) == ref.snapshot(now), f"seed {seed} at {now}: {event!r}"
        for d in got:
            if isinstance(d, StartBackend):
                loaded[d.backend] = d.gpus
                heapq.heappush(
                    later, (now + models[d.backend][1], next(seq), BackendReady(backend=d.backend))
                )
            elif isinstance(d, StopBackend):
                loaded.pop(d.backend, None)
                heapq.heappush(later, (now + 1.0, next(seq), BackendStopped(backend=d.backend)))
            elif isinstance(d, Dispatch):
                took = rng.expovariate(1 / models[d.backend][2])
                heapq.heappush(
                    later, (now + took, next(seq), RequestFinished(request_id=d.request_id))
                )

    for name, (gpu, load, _, _) in models.items():
        feed(
            ProfileMeasured(
                backend=name, gpu_bytes=int(gpu * GIB), host_bytes=GIB, load_s=load, source="stored"
            )
        )
    names = list(models)
    weights = [w for (_, _, _, w) in models.values()]
    for _ in range(events):
        roll = rng.random()
        wake = inc.next_wakeup()
        if roll < 0.35:
            now += rng.expovariate(1 / 3.0)
            start_by = now + rng.uniform(5, 300) if rng.random() < 0.3 else None
            feed(
                RequestArrived(
                    request_id=f"r{next(ids)}",
                    backend=rng.choices(names, weights)[0],
                    priority=rng.choice((10, 50, 90)),
                    start_by=start_by,
                    allow_late=rng.random() < 0.5,
                )
            )
        elif roll < 0.40:
            g = rng.choice(gpus)
            held = sorted((n, int(models[n][0] * GIB)) for n, on in loaded.items() if g in on)
            used = sum(b for _, b in held) + rng.randrange(0, GIB)
            feed(MemoryMeasured(device=g, used_bytes=used, backends=tuple(held)))
        elif later and (wake is None or later[0][0] <= wake):
            at, _, event = heapq.heappop(later)
            now = max(now, at)
            feed(event)
        elif wake is not None:
            now = max(now, wake)
            feed(Tick())


@pytest.mark.parametrize("seed", range(1, 7))
def test_incremental_planning_decides_and_explains_as_a_full_replan(seed: int) -> None:
    _run_twins(seed, events=1_500)


@pytest.mark.parametrize("seed", range(1, 5))
def test_incremental_planning_of_a_model_zoo_decides_and_explains_as_a_full_replan(
    seed: int,
) -> None:
    _run_twins(seed, events=1_500, models=ZOO, gpus=("gpu0", "gpu1"), host_gib=3)


@pytest.mark.parametrize("seed", range(1, 3))
def test_incremental_planning_of_thirty_models_decides_and_explains_as_a_full_replan(
    seed: int,
) -> None:
    _run_twins(seed, events=1_200, models=BIG_ZOO, gpus=("gpu0", "gpu1"))
