"""The named scenarios of ``python -m sim report``, and the small ones the tests use.

- ``ten-jobs``: one GPU that fits two of three models, ten requests at given times
  with given priorities, one with a start-by deadline. Exactly one dispatch order can
  come out (``tests/sim/test_ten_jobs.py`` derives it by hand).
- ``radio-day-1gpu`` / ``radio-day-2gpu``: a radio station's 24 hours on one or two
  24 GiB GPUs (see :func:`radio_day`).
- ``sweep-0.8x`` ... ``sweep-3.0x``: eight models whose declared sizes add up to
  0.8 to 3 times the GPU, under a mixed two-hour workload.
- ``faults-*`` (:func:`fault_scenario`): one fault each, on a small workload.
- ``chaos-SEED`` (:func:`chaos`): random faults drawn from the seed.
- ``radio-day-Ngpu-announced``, ``batch-*``: work yard can see coming
  (:mod:`sim.scenarios_ahead`).
"""

from __future__ import annotations

import math
import random

from sim.workload import Arrival, Scenario, Workload, lognormal, poisson_times, renumber
from sim.world import (
    CrashWhileLoading,
    CrashWhileServing,
    Fault,
    ForeignMemory,
    GiB,
    HangOnLoad,
    MachineSpec,
    ModelSpec,
    SlowStart,
)
from yard.core.spec import Profile

HOUR = 3600.0
MINUTE = 60.0

# -- ten jobs, three models, one deadline --------------------------------------------

TEN_JOBS_MODELS = (
    ModelSpec(name="llm", gpu_bytes=10 * GiB, load_s=20.0, load_jitter=0.0),
    ModelSpec(name="image", gpu_bytes=8 * GiB, load_s=10.0, load_jitter=0.0),
    ModelSpec(name="tts", gpu_bytes=6 * GiB, load_s=5.0, load_jitter=0.0),
)
"""Any two fit on the 20 GiB GPU (with the 1.10 margin: 11 + 8.8, 11 + 6.6,
8.8 + 6.6), all three (26.4 GiB) do not."""

# (at, request id, backend, priority, service seconds, start_by)
TEN_JOBS: tuple[tuple[float, str, str, float, float, float | None], ...] = (
    (0.0, "j01", "llm", 50, 30.0, None),
    (1.0, "j02", "llm", 50, 30.0, None),
    (2.0, "j03", "image", 20, 10.0, None),
    (3.0, "j04", "tts", 80, 5.0, None),
    (4.0, "j05", "llm", 10, 30.0, None),
    (5.0, "j06", "image", 60, 10.0, None),
    (10.0, "j07", "tts", 30, 5.0, None),
    (12.0, "j08", "image", 40, 10.0, 90.0),
    (15.0, "j09", "llm", 70, 30.0, None),
    (22.0, "j10", "tts", 90, 5.0, None),
)


def _ten_jobs_workload(rng: random.Random) -> list[Arrival]:
    return [
        Arrival(
            at=at,
            request_id=rid,
            backend=backend,
            priority=priority,
            service_s=service,
            cls="high" if priority >= 70 else "low" if priority < 30 else "normal",
            start_by=start_by,
        )
        for at, rid, backend, priority, service, start_by in TEN_JOBS
    ]


def ten_jobs() -> Scenario:
    return Scenario(
        name="ten-jobs",
        title="ten jobs, three models, one deadline (one 20 GiB GPU fits two)",
        machine=MachineSpec(gpus=(("gpu0", 20 * GiB),), reserve_bytes=0),
        models=TEN_JOBS_MODELS,
        workload=_ten_jobs_workload,
        horizon_s=3600.0,
        stored_profiles=True,
        meter_interval_s=3600.0,
    )


# -- a radio station's day -------------------------------------------------------------


def _radio_models(gpus: tuple[str, ...]) -> tuple[ModelSpec, ...]:
    return (
        ModelSpec(
            name="news-llm",
            gpu_bytes=12 * GiB,
            host_bytes=2 * GiB,
            load_s=40.0,
            warmup_extra_bytes=1 * GiB,
            growth_bytes=1 * GiB,
            gpus=gpus,
            # A 12 B model with grouped-query attention: 160 KiB a token, 8k context.
            kv_bytes=5 * GiB // 4,
            context_tokens=8192,
        ),
        ModelSpec(
            name="chat-llm",
            gpu_bytes=4 * GiB,
            load_s=12.0,
            warmup_extra_bytes=GiB // 2,
            growth_bytes=GiB // 2,
            slots=4,
            gpus=gpus,
            # A 3 B model: 112 KiB a token, 4k context for each of its 4 slots.
            kv_bytes=7 * GiB // 4,
            context_tokens=16384,
        ),
        ModelSpec(
            name="tts",
            gpu_bytes=2 * GiB,
            load_s=8.0,
            warmup_extra_bytes=GiB // 4,
            growth_bytes=GiB // 4,
            slots=2,
            gpus=gpus,
        ),
        ModelSpec(
            name="image",
            gpu_bytes=7 * GiB,
            host_bytes=3 * GiB,
            load_s=25.0,
            warmup_extra_bytes=3 * GiB // 2,
            growth_bytes=1 * GiB,
            gpus=gpus,
        ),
        ModelSpec(
            name="music",
            gpu_bytes=9 * GiB,
            host_bytes=3 * GiB,
            load_s=30.0,
            warmup_extra_bytes=1 * GiB,
            growth_bytes=5 * GiB // 2,
            gpus=gpus,
        ),
    )


def chat_rate(t: float) -> float:
    """Listener chat requests per second at time ``t`` (a night trough from 00:00 to
    05:00, a day curve peaking mid-afternoon)."""
    hour = (t / HOUR) % 24
    if hour < 5:
        return 0.12
    curve: float = max(0.0, math.sin(math.pi * (hour - 5) / 19)) ** 0.7
    return 0.12 + 0.86 * curve


def radio_day_workload(rng: random.Random, hours: float = 24.0) -> list[Arrival]:
    """The radio station's requests over ``hours`` from midnight.

    - Hourly news (high, 90): three scripts per hour on the big LLM, arriving at
      :30-:35, must start by :50 (ten minutes before the next hour's news).
    - Voice-over (high, 90): three TTS requests at :52-:54, must start by :58.
    - Listener chat (normal, 50): Poisson arrivals on the day/night curve
      (:func:`chat_rate`); one in a hundred clients gives up after a minute.
    - Show art (normal, 40): a show every two hours from 06:00; four images each,
      asked an hour before, must start fifteen minutes before the show.
    - Overnight music (low, 10): long generations from 00:00 to 05:30.
    - Breaking news (high, 95): at a random time between 10:00 and 16:00, six
      scripts that must start within six minutes, six voice-overs within nine, and
      half an hour of triple listener chat.
    """
    end = hours * HOUR
    out: list[Arrival] = []

    def add(**kw: object) -> None:
        out.append(Arrival(request_id="", **kw))  # type: ignore[arg-type]

    for t in poisson_times(rng, 0.0, end, chat_rate, 1.0):
        add(
            at=t,
            backend="chat-llm",
            priority=50.0,
            service_s=lognormal(rng, 2.5, 0.6),
            cls="normal",
            app="chat",
            cancel_after_s=60.0 if rng.random() < 0.01 else None,
        )
    for hour in range(math.ceil(hours)):
        base = hour * HOUR
        for _ in range(3):
            at = base + 30 * MINUTE + rng.uniform(0, 5 * MINUTE)
            if at < end:
                add(
                    at=at,
                    backend="news-llm",
                    priority=90.0,
                    service_s=lognormal(rng, 90.0, 0.3),
                    cls="high",
                    app="newsroom",
                    start_by=base + 50 * MINUTE,
                )
            at = base + 52 * MINUTE + rng.uniform(0, 2 * MINUTE)
            if at < end:
                add(
                    at=at,
                    backend="tts",
                    priority=90.0,
                    service_s=lognormal(rng, 30.0, 0.3),
                    cls="high",
                    app="newsroom",
                    start_by=base + 58 * MINUTE,
                )
    for show in range(6, 24, 2):
        start = show * HOUR
        for _ in range(4):
            at = start - HOUR + rng.uniform(0, 10 * MINUTE)
            if at < end:
                add(
                    at=at,
                    backend="image",
                    priority=40.0,
                    service_s=lognormal(rng, 20.0, 0.3),
                    cls="normal",
                    app="art",
                    start_by=start - 15 * MINUTE,
                )
    for t in poisson_times(rng, 0.0, min(end, 5.5 * HOUR), lambda t: 1 / 600, 1 / 600):
        add(
            at=t,
            backend="music",
            priority=10.0,
            service_s=lognormal(rng, 300.0, 0.5),
            cls="low",
            app="music",
        )
    burst = rng.uniform(10 * HOUR, 16 * HOUR)
    if burst < end:
        for _ in range(6):
            add(
                at=burst + rng.uniform(0, MINUTE),
                backend="news-llm",
                priority=95.0,
                service_s=lognormal(rng, 45.0, 0.3),
                cls="high",
                app="newsroom",
                start_by=burst + 6 * MINUTE,
            )
            add(
                at=burst + 4 * MINUTE + rng.uniform(0, MINUTE),
                backend="tts",
                priority=95.0,
                service_s=lognormal(rng, 20.0, 0.3),
                cls="high",
                app="newsroom",
                start_by=burst + 9 * MINUTE,
            )
        for t in poisson_times(rng, burst, min(end, burst + 30 * MINUTE), lambda t: 1.5, 1.5):
            add(
                at=t,
                backend="chat-llm",
                priority=50.0,
                service_s=lognormal(rng, 2.5, 0.6),
                cls="normal",
                app="chat",
            )
    return renumber(out)


def radio_day(gpu_count: int, hours: float = 24.0, *, first_day: bool = False) -> Scenario:
    """The radio station's day on ``gpu_count`` 24 GiB GPUs (``hours`` < 24: a slice
    from midnight, for tests).

    An ordinary day starts with the profiles measured on earlier days. The
    ``first_day`` starts with none: yard measures each model's first load alone.
    """
    gpus = tuple(f"gpu{i}" for i in range(gpu_count))
    suffix = ("" if hours == 24.0 else f"-{hours:g}h") + ("-first-day" if first_day else "")
    what = "first day (no profiles yet)" if first_day else "day"
    return Scenario(
        name=f"radio-day-{gpu_count}gpu{suffix}",
        title=f"a radio station's {what} on {gpu_count} x 24 GiB",
        machine=MachineSpec(gpus=tuple((g, 24 * GiB) for g in gpus)),
        models=_radio_models(gpus),
        workload=lambda rng: radio_day_workload(rng, hours),
        horizon_s=hours * HOUR + HOUR,
        stored_profiles=not first_day,
        meter_interval_s=10.0,
        seed=2024,
        policies=("yard",) if first_day else None,
    )


# -- memory pressure sweep ------------------------------------------------------------

SWEEP_FACTORS = (0.8, 1.2, 1.6, 2.0, 2.5, 3.0)
_SWEEP_WEIGHTS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5)


def _sweep_models(factor: float) -> tuple[ModelSpec, ...]:
    capacity = 24 * GiB
    total = sum(_SWEEP_WEIGHTS)
    models = []
    for i, weight in enumerate(_SWEEP_WEIGHTS):
        size = int(capacity * factor * weight / total)
        models.append(
            ModelSpec(
                name=f"m{i}",
                gpu_bytes=size,
                load_s=5.0 + 3.0 * size / GiB,
                warmup_extra_bytes=size // 20,
                growth_bytes=size // 20,
                slots=2,
            )
        )
    return tuple(models)


def _sweep_workload(rng: random.Random) -> list[Arrival]:
    names = [f"m{i}" for i in range(len(_SWEEP_WEIGHTS))]
    # Zipf-like popularity: the smallest model is the most asked for.
    popularity = [1 / (i + 1) for i in range(len(names))]
    out = []
    for t in poisson_times(rng, 0.0, 2 * HOUR, lambda t: 0.15, 0.15):
        backend = rng.choices(names, popularity)[0]
        draw = rng.random()
        if draw < 0.1:
            out.append(
                Arrival(
                    at=t,
                    request_id="",
                    backend=backend,
                    priority=90.0,
                    service_s=lognormal(rng, 4.0, 0.5),
                    cls="high",
                    start_by=t + 180.0 if rng.random() < 0.2 else None,
                )
            )
        elif draw < 0.8:
            out.append(
                Arrival(
                    at=t,
                    request_id="",
                    backend=backend,
                    priority=50.0,
                    service_s=lognormal(rng, 4.0, 0.5),
                    cls="normal",
                )
            )
        else:
            out.append(
                Arrival(
                    at=t,
                    request_id="",
                    backend=backend,
                    priority=10.0,
                    service_s=lognormal(rng, 20.0, 0.5),
                    cls="low",
                )
            )
    return renumber(out)


def sweep(factor: float) -> Scenario:
    return Scenario(
        name=f"sweep-{factor:.1f}x",
        title=f"memory pressure: models add up to {factor:.1f}x the GPU",
        machine=MachineSpec(gpus=(("gpu0", 24 * GiB),)),
        models=_sweep_models(factor),
        workload=_sweep_workload,
        horizon_s=8 * HOUR,
        stored_profiles=True,
        seed=7,
    )


# -- faults -----------------------------------------------------------------------------

FAULT_KINDS = (
    "crash-while-loading",
    "crash-while-serving",
    "oom-overcommit",
    "hang",
    "slow-start",
    "foreign-memory",
    "client-cancels",
)


def _fault_models() -> tuple[ModelSpec, ...]:
    return (
        ModelSpec(name="big", gpu_bytes=10 * GiB, load_s=20.0, growth_bytes=GiB, slots=2),
        ModelSpec(name="small", gpu_bytes=4 * GiB, load_s=8.0, growth_bytes=GiB // 2, slots=2),
    )


def _fault_workload(cancels: bool) -> Workload:
    def make(rng: random.Random) -> list[Arrival]:
        out = []
        for t in poisson_times(rng, 0.0, 30 * MINUTE, lambda t: 0.1, 0.1):
            backend = "big" if rng.random() < 0.4 else "small"
            out.append(
                Arrival(
                    at=t,
                    request_id="",
                    backend=backend,
                    priority=rng.choice((10.0, 50.0, 90.0)),
                    service_s=lognormal(rng, 15.0, 0.5),
                    cls="normal",
                    cancel_after_s=rng.uniform(1.0, 60.0)
                    if cancels and rng.random() < 0.3
                    else None,
                )
            )
        return renumber(out)

    return make


def fault_scenario(kind: str) -> Scenario:
    """A 30-minute, two-model workload on one 18 GiB GPU with one kind of fault.

    ``oom-overcommit`` gives yard a stored profile that is too small (the model grows
    past it after the first request), so yard over-commits once and must requeue.
    """
    faults: tuple[Fault, ...] = ()
    cancels = False
    models = _fault_models()
    profiles: dict[str, Profile] | None = None
    if kind == "crash-while-loading":
        faults = (CrashWhileLoading(backend="big", load=1),)
    elif kind == "crash-while-serving":
        faults = (CrashWhileServing(backend="small", at=300.0),)
    elif kind == "oom-overcommit":
        models = (
            ModelSpec(name="big", gpu_bytes=10 * GiB, load_s=20.0, growth_bytes=4 * GiB, slots=2),
            models[1],
        )
        # Measured on a day it never grew: 4 GiB short.
        profiles = {
            "big": Profile(gpu_bytes=10 * GiB, host_bytes=GiB, load_s=20.0),
            "small": Profile(gpu_bytes=9 * GiB // 2, host_bytes=GiB, load_s=8.0),
        }
    elif kind == "hang":
        faults = (HangOnLoad(backend="big", load=1),)
    elif kind == "slow-start":
        faults = (SlowStart(backend="big", load=1, factor=4.0),)
    elif kind == "foreign-memory":
        faults = (ForeignMemory(device="gpu0", at=120.0, bytes=6 * GiB, until=900.0),)
    elif kind == "client-cancels":
        cancels = True
    else:
        raise KeyError(kind)
    return Scenario(
        name=f"faults-{kind}",
        title=f"fault: {kind}",
        machine=MachineSpec(gpus=(("gpu0", 18 * GiB),)),
        models=models,
        workload=_fault_workload(cancels),
        faults=faults,
        horizon_s=2 * HOUR,
        stored_profiles=True,
        profiles=profiles,
        meter_interval_s=2.0,
        seed=11,
    )


def _chaos_faults(rng: random.Random) -> tuple[Fault, ...]:
    faults: list[Fault] = []
    for _ in range(rng.randint(2, 6)):
        backend = rng.choice(("big", "small"))
        kind = rng.randrange(5)
        if kind == 0:
            faults.append(CrashWhileLoading(backend=backend, load=rng.randint(1, 3)))
        elif kind == 1:
            faults.append(HangOnLoad(backend=backend, load=rng.randint(1, 3)))
        elif kind == 2:
            faults.append(SlowStart(backend=backend, load=rng.randint(1, 3), factor=3.0))
        elif kind == 3:
            faults.append(CrashWhileServing(backend=backend, at=rng.uniform(0, 25 * MINUTE)))
        else:
            at = rng.uniform(0, 25 * MINUTE)
            faults.append(
                ForeignMemory(
                    device="gpu0",
                    at=at,
                    bytes=rng.randint(1, 6) * GiB,
                    until=at + rng.uniform(MINUTE, 10 * MINUTE),
                )
            )
    return tuple(faults)


def chaos(seed: int) -> Scenario:
    """The fault workload (with client cancels) and two to six faults of any kind,
    all drawn from ``seed``: the simulator's VOPR."""
    return Scenario(
        name=f"chaos-{seed}",
        title="random faults",
        machine=MachineSpec(gpus=(("gpu0", 18 * GiB),)),
        models=_fault_models(),
        workload=_fault_workload(True),
        fault_plan=_chaos_faults,
        horizon_s=2 * HOUR,
        stored_profiles=seed % 2 == 0,
        meter_interval_s=2.0,
        seed=seed,
    )


# -- the catalogue ------------------------------------------------------------------------


def report_scenarios() -> list[Scenario]:
    """The scenarios ``python -m sim report`` runs, in order."""
    from sim import scenarios_ahead

    return [
        ten_jobs(),
        radio_day(1),
        radio_day(2),
        radio_day(1, first_day=True),
        *(sweep(f) for f in SWEEP_FACTORS),
        *scenarios_ahead.report_scenarios(),
    ]


def get(name: str) -> Scenario:
    """A scenario by name (report scenarios, ``faults-KIND``, ``radio-day-Ngpu-Hh``)."""
    for scenario in report_scenarios():
        if scenario.name == name:
            return scenario
    from sim import scenarios_ahead

    ahead = scenarios_ahead.get(name)
    if ahead is not None:
        return ahead
    from sim import scenarios_apps

    apps = scenarios_apps.get(name)
    if apps is not None:
        return apps
    if name.startswith("chaos-"):
        return chaos(int(name.removeprefix("chaos-")))
    if name.startswith("faults-"):
        return fault_scenario(name.removeprefix("faults-"))
    if name.startswith("radio-day-"):
        rest = name.removeprefix("radio-day-")
        first_day = rest.endswith("-first-day")
        gpus, _, hours = rest.removesuffix("-first-day").partition("-")
        return radio_day(
            int(gpus.removesuffix("gpu")),
            float(hours.removesuffix("h") or 24),
            first_day=first_day,
        )
    raise KeyError(f"no scenario {name!r}")
