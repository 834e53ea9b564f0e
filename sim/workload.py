"""Workloads and scenarios: what arrives when, on which machine.

A :class:`Scenario` is data plus one function that turns the simulator's
``random.Random`` into a list of :class:`Arrival`. Nothing here reads a clock or
any other source of randomness, so a seed gives one workload, always.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sim.world import Fault, MachineSpec, ModelSpec
from yard.core.spec import Profile, SchedulerConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrival:
    """One request of a workload.

    at: arrival time (engine clock: seconds since the simulation started).
    service_s: how long the backend works on it once dispatched.
    cls: its priority class for the report (``high``, ``normal``, ``low``).
    start_by: latest start (absolute), or None.
    cancel_after_s: the client gives up after this long (queued or running).
    batch: the batch it is a line of ("": none); see ``Scenario.batch_queued_lines``.
    """

    at: float
    request_id: str
    backend: str
    priority: float
    service_s: float
    cls: str
    app: str = ""
    start_by: float | None = None
    allow_late: bool = False
    cancel_after_s: float | None = None
    batch: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Announcement:
    """An app tells yard ahead of time that ``count`` requests for ``backend`` will
    come inside ``[not_before, start_by)`` at ``priority`` (no bodies yet).

    at: when it is announced (engine clock, like every time here).
    label: how people read ``not_before`` ("13:30"), for the core's reasons.
    """

    at: float
    announcement_id: str
    backend: str
    app: str
    not_before: float
    start_by: float
    count: int
    priority: float
    label: str = ""


Workload = Callable[[random.Random], list[Arrival]]


@dataclass(frozen=True, slots=True, kw_only=True)
class AppLimits:
    """The ``[apps.NAME]`` limits a scenario runs yard with (the baselines ignore
    them): ``max_queued`` at the engine's admission, ``max_concurrent`` and
    ``weights`` in the core. Apps not named have none."""

    max_queued: Mapping[str, int] = field(default_factory=dict)
    max_concurrent: Mapping[str, int] = field(default_factory=dict)
    weights: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A machine, its backends, a workload and the faults to inject.

    horizon_s: the simulation stops here; a request still open then is "stuck"
        (a lost request: a bug in the engine or a policy).
    stored_profiles: yard starts with profiles measured on an earlier run (exact
        figures: peak footprint, mean load time); otherwise it measures each first
        load alone. profiles: stored profiles to use instead of the exact ones.
    meter_interval_s: how often the engine reads the simulated meter.
    seed: the default seed of ``python -m sim report``.
    policies: the policies the report runs it under (None: all).
    fault_plan: draws more faults from the run's generator, after the workload.
    apps: per-app limits and weights for yard (see :class:`AppLimits`).
    announcements: what the apps announce, worked out from the workload (no draws,
        so a scenario with and without them sees the same requests); only yard's
        core is told, the baselines have no way to take them.
    batch_queued_lines: 0: a batch's lines arrive at their time like any request;
        else they are fed as yard/batches does (``[jobs] batch_queued_lines``): in
        order from the first line's time, at most this many open at once, and on a
        backend where none has ended yet at most its slots. A line's arrival is
        then the moment it is handed in.
    """

    name: str
    title: str
    machine: MachineSpec
    models: tuple[ModelSpec, ...]
    workload: Workload
    horizon_s: float
    faults: tuple[Fault, ...] = ()
    stored_profiles: bool = False
    profiles: Mapping[str, Profile] | None = None
    meter_interval_s: float = 5.0
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    seed: int = 1
    policies: tuple[str, ...] | None = None
    fault_plan: Callable[[random.Random], tuple[Fault, ...]] | None = None
    announcements: Callable[[Sequence[Arrival]], list[Announcement]] | None = None
    batch_queued_lines: int = 0
    apps: AppLimits | None = None

    def model(self, name: str) -> ModelSpec:
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(name)


class Ids:
    """Request ids in arrival order: ``r000001``, ..."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self) -> str:
        self._next += 1
        return f"r{self._next:06d}"


def poisson_times(
    rng: random.Random, start: float, end: float, rate: Callable[[float], float], peak: float
) -> list[float]:
    """Arrival times of a Poisson process with time-varying ``rate`` (per second,
    never above ``peak``) on [start, end), by thinning."""
    times: list[float] = []
    t = start
    while True:
        t += rng.expovariate(peak)
        if t >= end:
            return times
        if rng.random() * peak < rate(t):
            times.append(t)


def lognormal(rng: random.Random, mean: float, sigma: float = 0.5) -> float:
    """A lognormal draw with the given mean (long-tailed service times)."""
    mu = math.log(mean) - sigma * sigma / 2
    return rng.lognormvariate(mu, sigma)


def renumber(arrivals: list[Arrival]) -> list[Arrival]:
    """Sort by time and give ids in arrival order."""
    ids = Ids()
    ordered = sorted(arrivals, key=lambda a: (a.at, a.backend, a.priority))
    return [
        Arrival(
            at=a.at,
            request_id=ids(),
            backend=a.backend,
            priority=a.priority,
            service_s=a.service_s,
            cls=a.cls,
            app=a.app,
            start_by=a.start_by,
            allow_late=a.allow_late,
            cancel_after_s=a.cancel_after_s,
        )
        for a in ordered
    ]
