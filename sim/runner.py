"""Run one scenario under one policy on virtual time: the same engine as ``yard serve``,
with the simulated world at its edges.

One seed, one run: the seed makes the workload and every random draw of the world
(one ``random.Random``), and it seeds Trio's own scheduling order (see
:func:`_deterministic_trio`), so the decision log of a seed is byte-identical from
run to run. A run that raises prints its scenario, policy and seed on stderr.
"""

from __future__ import annotations

import hashlib
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import trio
import trio.testing

from sim.baselines import BASELINES
from sim.workload import Announcement, Arrival, Scenario
from sim.world import FIT_MARGIN, Fault, ModelSpec, OomKill, SimWorld
from yard.core.decisions import AnnouncementEnded, Decision, Dispatch
from yard.core.events import AnnouncementMade, Event
from yard.core.spec import Profile
from yard.core.views import QueuedView, Snapshot
from yard.engine import Engine, EngineStatistics, Policy
from yard.errors import Rejected

POLICIES = ("yard", *BASELINES)
"""Every policy the simulator can run: yard's core first, then the baselines."""


class DoubleEnd(AssertionError):
    """A request ended twice: an engine or policy bug the simulation must catch."""


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request of the workload.

    ready_at_arrival: its backend was loaded and serving when it arrived.
    dispatches: every time it was dispatched (more than one after a requeue).
    outcome: ``ok``, ``rejected`` (with ``code``), ``cancelled``; None while open
        (a request still open at the horizon is stuck).
    """

    arrival: Arrival
    ready_at_arrival: bool
    dispatches: list[float] = field(default_factory=list)
    outcome: str | None = None
    code: str = ""
    ended_at: float | None = None

    def end(self, outcome: str, code: str = "") -> None:
        if self.outcome is not None:
            raise DoubleEnd(
                f"{self.arrival.request_id} ended twice: {self.outcome} then {outcome} {code}"
            )
        self.outcome = outcome
        self.code = code
        self.ended_at = trio.current_time()


@dataclass(slots=True, kw_only=True)
class SimResult:
    """Everything a run leaves behind, for the report and the tests."""

    scenario: Scenario
    policy: str
    seed: int
    records: list[RequestRecord]
    log_digest: str
    log: list[str] | None
    dispatch_order: list[tuple[float, str]]
    launches: list[tuple[float, str, tuple[str, ...]]]
    ooms: list[OomKill]
    gpu_seconds: dict[str, dict[str, float]]
    statistics: EngineStatistics
    faults: list[str]
    end_time: float
    wall_s: float
    announced: int = 0
    announcement_outcomes: dict[str, int] = field(default_factory=dict)
    launch_slots: list[int] = field(default_factory=list)  # beside ``launches``

    @property
    def stuck(self) -> list[RequestRecord]:
        return [r for r in self.records if r.outcome is None]


class _Recorder:
    """Wraps a policy: hashes (and optionally keeps) every decision with its time,
    and notes the dispatch order for the lower bounds."""

    def __init__(self, policy: Policy, keep: bool) -> None:
        self.policy = policy
        self.hash = hashlib.sha256()
        self.lines: list[str] | None = [] if keep else None
        self.dispatches: list[tuple[float, str]] = []
        self.announcement_outcomes: dict[str, int] = {}

    def handle(self, event: Event, now: float) -> list[Decision]:
        decisions = self.policy.handle(event, now)
        for decision in decisions:
            line = f"{now:.6f} {decision!r}\n"
            self.hash.update(line.encode())
            if self.lines is not None:
                self.lines.append(line)
            if type(decision) is Dispatch:
                self.dispatches.append((now, decision.backend))
            elif type(decision) is AnnouncementEnded:
                outcomes = self.announcement_outcomes
                outcomes[decision.outcome] = outcomes.get(decision.outcome, 0) + 1
        return decisions

    def next_wakeup(self) -> float | None:
        return self.policy.next_wakeup()

    def snapshot(self, now: float, limit: int = 200) -> Snapshot:
        return self.policy.snapshot(now, limit)

    def explain(self, request_id: str, now: float) -> QueuedView | None:
        return self.policy.explain(request_id, now)

    def profile(self, backend: str) -> Profile | None:
        return self.policy.profile(backend)


def make_policy(name: str, scenario: Scenario) -> Policy:
    """Build ``name`` (see :data:`POLICIES`) for the scenario's machine and backends."""
    devices = scenario.machine.device_specs()
    backends = [m.backend_spec() for m in scenario.models]
    if name == "yard":
        from yard.core import Scheduler

        apps = scenario.apps
        policy: Policy = Scheduler(
            devices,
            backends,
            scenario.config,
            max_concurrent=apps.max_concurrent if apps else None,
            weights=apps.weights if apps else None,
        )
        return policy
    # A baseline runs each server with a fixed configuration: a slot range as its
    # maximum (llama-swap's command, OLLAMA_NUM_PARALLEL), told the size at it.
    fixed = [m.fixed() for m in scenario.models]
    factory = BASELINES[name]
    return factory(
        devices,
        [m.backend_spec() for m in fixed],
        # llama-swap's matrix is written by hand: from what each model was seen to
        # hold at its most; the others are told the declared size.
        {
            m.name: m.peak_gpu_bytes if getattr(factory, "sizes_seen", False) else m.declared_bytes
            for m in fixed
        },
        {m.name: m.load_s for m in fixed},
    )


def stored_profile(model: ModelSpec) -> Profile:
    """What ``yard probe`` (or an earlier day) measured of ``model``: its peak and
    mean load time; with a slot range, at its fewest slots with the slot slope
    (the KV cache of each further slot; no host memory per slot)."""
    if model.parallel is None:
        return Profile(
            gpu_bytes=model.peak_gpu_bytes, host_bytes=model.host_bytes, load_s=model.load_s
        )
    return Profile(
        gpu_bytes=model.peak_gpu_bytes,
        host_bytes=model.host_bytes,
        load_s=model.load_s,
        parallel=model.base_slots,
        gpu_per_slot=float(model.slot_bytes),
        host_per_slot=0.0,
    )


def _deterministic_trio(seed: int) -> None:
    """Make Trio's run loop order same-instant tasks from a seed.

    Trio shuffles each batch of runnable tasks with a module-level ``random.Random``
    unless deterministic scheduling is on (the switch pytest-trio and Hypothesis
    flip for reproducible tests). The simulator owns every source of randomness, so
    it flips the same switch and seeds that generator from its own.
    """
    import trio._core._run as trio_run

    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio_run._r.seed(seed)


def run(
    scenario: Scenario,
    policy: str = "yard",
    seed: int | None = None,
    *,
    keep_log: bool = False,
    on_started: Callable[[Engine, SimWorld], None] | None = None,
) -> SimResult:
    """Simulate ``scenario`` under ``policy`` with ``seed`` (default: the scenario's).

    keep_log: keep the decision log lines (the digest is always computed).
    on_started: called once the engine is serving (tests use it to look inside).
    """
    seed = scenario.seed if seed is None else seed
    try:
        rng = random.Random(seed)
        arrivals = scenario.workload(rng)
        # Only yard's core can take announcements; the baselines see the requests alone.
        announcements: list[Announcement] = []
        if scenario.announcements is not None and policy == "yard":
            announcements = sorted(
                scenario.announcements(arrivals), key=lambda a: (a.at, a.announcement_id)
            )
        faults = scenario.faults + (scenario.fault_plan(rng) if scenario.fault_plan else ())
        _deterministic_trio(rng.getrandbits(64))
        started = time.perf_counter()
        result = trio.run(
            _simulate,
            scenario,
            policy,
            seed,
            rng,
            arrivals,
            announcements,
            faults,
            keep_log,
            on_started,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )
        result.wall_s = time.perf_counter() - started
        return result
    except BaseException:
        print(
            f"simulation failed: scenario={scenario.name} policy={policy} seed={seed} "
            f"(replay: sim.runner.run(scenarios.get({scenario.name!r}), {policy!r}, {seed}))",
            file=sys.stderr,
        )
        raise


async def _simulate(
    scenario: Scenario,
    policy_name: str,
    seed: int,
    rng: random.Random,
    arrivals: list[Arrival],
    announcements: list[Announcement],
    faults: tuple[Fault, ...],
    keep_log: bool,
    on_started: Callable[[Engine, SimWorld], None] | None,
) -> SimResult:
    stored: dict[str, Profile] | None = None
    if scenario.profiles is not None:
        stored = dict(scenario.profiles)
    elif scenario.stored_profiles:
        stored = {m.name: stored_profile(m) for m in scenario.models}
    policy = make_policy(policy_name, scenario)
    world = SimWorld(
        scenario.machine,
        scenario.models,
        rng,
        faults=faults,
        stored_profiles=stored,
        # llama.cpp's router starts each server with --fit: it fits itself.
        fit_margin=FIT_MARGIN if getattr(policy, "fits_children", False) else None,
    )
    recorder = _Recorder(policy, keep_log)
    load_s = {m.name: m.load_s for m in scenario.models}
    engine = Engine(
        scheduler=recorder,
        launcher=world,
        meter=world,
        profiles=world,
        logs=world,
        start_timeout_s=lambda backend: max(60.0, 5 * load_s.get(backend, 60.0)),
        meter_interval_s=scenario.meter_interval_s,
        profile_interval_s=0.25,
        max_queued=scenario.apps.max_queued if scenario.apps and policy_name == "yard" else None,
    )
    ledger = world.ledger
    records: list[RequestRecord] = []

    async def client(admission_id: int, record: RequestRecord) -> None:
        arrival = record.arrival
        admission = admissions[admission_id]
        waiting = True
        patience = math.inf if arrival.cancel_after_s is None else arrival.cancel_after_s
        with trio.move_on_after(patience):
            while True:
                try:
                    assignment = await admission.wait_dispatched()
                except Rejected as exc:
                    if waiting:
                        ledger.wait(arrival.backend, -1)
                    record.end("rejected", exc.code)
                    return
                record.dispatches.append(trio.current_time())
                if waiting:
                    ledger.wait(arrival.backend, -1)
                    waiting = False
                if await world.serve(assignment.base_url, arrival.service_s):
                    admission.report("ok")
                    record.end("ok")
                    return
                admission.report("upstream_lost", "connection reset by peer")
                ledger.wait(arrival.backend, +1)
                waiting = True
        # Only the client's own patience ends up here; the horizon cancels through.
        admission.cancel()
        if waiting:
            ledger.wait(arrival.backend, -1)
        record.end("cancelled")

    async def announce(announcement: Announcement) -> None:
        if announcement.at > trio.current_time():
            await trio.sleep_until(announcement.at)
        engine.send(
            AnnouncementMade(
                announcement_id=announcement.announcement_id,
                app=announcement.app,
                backend=announcement.backend,
                not_before=announcement.not_before,
                start_by=announcement.start_by,
                count=announcement.count,
                priority=announcement.priority,
                label=announcement.label,
            )
        )

    # A batch's lines are fed as yard/batches feeds them (see ``feed``) when the
    # scenario says how many may be open at once; else they arrive like any request.
    direct: list[Arrival] = []
    batches: dict[str, list[Arrival]] = {}
    for arrival in arrivals:
        if arrival.batch and scenario.batch_queued_lines:
            batches.setdefault(arrival.batch, []).append(arrival)
        else:
            direct.append(arrival)
    admissions = []
    announced = 0
    async with trio.open_nursery() as root:
        await root.start(world.run)
        await root.start(engine.run)
        if on_started is not None:
            on_started(engine, world)
        with trio.move_on_at(scenario.horizon_s):
            async with trio.open_nursery() as clients:

                def hand_in(
                    arrival: Arrival, done: Callable[[RequestRecord], None] | None = None
                ) -> None:
                    record = RequestRecord(arrival, ready_at_arrival=world.ready(arrival.backend))
                    records.append(record)
                    # Submitted here, in arrival order, not by the client task, so that
                    # same-instant arrivals reach the core in workload order.
                    try:
                        admission = engine.submit(
                            backend=arrival.backend,
                            priority=arrival.priority,
                            app=arrival.app,
                            request_id=arrival.request_id,
                            start_by=arrival.start_by,
                            allow_late=arrival.allow_late,
                        )
                    except Rejected as exc:  # at the door: [apps.NAME] max_queued
                        record.end("rejected", exc.code)
                        if done is not None:
                            done(record)
                        return
                    admissions.append(admission)
                    ledger.wait(arrival.backend, +1)
                    if done is None:
                        clients.start_soon(client, len(admissions) - 1, record)
                    else:
                        clients.start_soon(fed_client, len(admissions) - 1, record, done)

                async def fed_client(
                    admission_id: int, record: RequestRecord, done: Callable[[RequestRecord], None]
                ) -> None:
                    try:
                        await client(admission_id, record)
                    finally:
                        done(record)

                async def feed(lines: list[Arrival]) -> None:
                    """Hand a batch's lines in the way yard/batches does: in order, at
                    most ``scenario.batch_queued_lines`` open at once, and on a backend
                    where no line has ended yet no more than its slots."""
                    if lines[0].at > trio.current_time():
                        await trio.sleep_until(lines[0].at)
                    room = trio.Semaphore(scenario.batch_queued_lines)
                    open_on: dict[str, int] = {}
                    measured: set[str] = set()
                    ended = [trio.Event()]

                    def done(record: RequestRecord) -> None:
                        room.release()
                        open_on[record.arrival.backend] -= 1
                        if record.outcome == "ok":
                            measured.add(record.arrival.backend)
                        ended[0].set()
                        ended[0] = trio.Event()

                    for line in lines:
                        await room.acquire()
                        slots = scenario.model(line.backend).slots
                        while (
                            line.backend not in measured and open_on.get(line.backend, 0) >= slots
                        ):
                            await ended[0].wait()
                        open_on[line.backend] = open_on.get(line.backend, 0) + 1
                        hand_in(replace(line, at=trio.current_time()), done)

                for lines in batches.values():
                    clients.start_soon(feed, lines)
                for arrival in direct:
                    # An announcement goes ahead of a request of the same instant.
                    while announced < len(announcements) and (
                        announcements[announced].at <= arrival.at
                    ):
                        await announce(announcements[announced])
                        announced += 1
                    if arrival.at > trio.current_time():
                        await trio.sleep_until(arrival.at)
                    hand_in(arrival)
                for announcement in announcements[announced:]:
                    await announce(announcement)
                    announced += 1
        end_time = trio.current_time()
        ledger.close()
        statistics = engine.statistics()
        root.cancel_scope.cancel()
    return SimResult(
        scenario=scenario,
        policy=policy_name,
        seed=seed,
        records=records,
        log_digest=recorder.hash.hexdigest(),
        log=recorder.lines,
        dispatch_order=recorder.dispatches,
        launches=world.launches,
        ooms=world.ooms,
        gpu_seconds=ledger.seconds,
        statistics=statistics,
        faults=world.fault_log,
        end_time=end_time,
        wall_s=0.0,
        announced=announced,
        announcement_outcomes=recorder.announcement_outcomes,
        launch_slots=world.launch_slots,
    )
