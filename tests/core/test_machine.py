"""Hypothesis explores the core against a simulated engine and checks its promises.

The machine plays the engine: it carries out every decision (a start becomes
``BackendReady`` after the backend's load time, a dispatch becomes
``RequestFinished`` after the request's service time, a stop becomes
``BackendStopped``) and sends ``Tick`` at ``next_wakeup()``. Hypothesis chooses
arrivals, cancellations, the passing of time and (in the faulty machine)
crashes, out-of-memory exits, lost connections and foreign memory.

Invariants:
- memory is never over-committed on any device (by reservations), and nothing
  loads next to a backend being measured;
- every request ends exactly once (finished, cancelled or rejected), and until
  then the core still knows it;
- no Dispatch to a backend that is not ready or has no free slot;
- no wait exceeds ``Scheduler.wait_bound()`` (calm machine: loads succeed,
  service times bounded), with app weights too (the weighted machines: three
  apps, one of them light, the bound widened by ``share_points``);
- a backend started for waiting requests serves one before it is evicted,
  unless nobody waits for it any more;
- the same events at the same times give the same decisions;
- incremental planning (a round revisits only what an event can change) gives
  the same decisions and the same views, on every step, as a scheduler that
  plans every waiting backend afresh on every event.
"""

from __future__ import annotations

import heapq
import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from yard.core import (
    HOST,
    AdminForgetProfile,
    AdminLoad,
    AdminPin,
    AdminUnload,
    BackendExited,
    BackendReady,
    BackendSpec,
    BackendStopped,
    Decision,
    DeviceSpec,
    Dispatch,
    Event,
    MemoryMeasured,
    ProfileMeasured,
    Reject,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    Requeue,
    Scheduler,
    SchedulerConfig,
    StartBackend,
    StopBackend,
    Tick,
)

GIB = 1024**3
MAX_SERVICE_S = 10.0
LOAD_S = {"chat": 5.0, "big": 20.0, "tts": 2.0, "wide": 8.0, "cpu": 3.0, "fresh": 6.0}
PROFILES = {  # gpu GiB, host GiB
    "chat": (10, 2),
    "big": (16, 4),
    "tts": (4, 1),
    "wide": (12, 2),
    "cpu": (0, 8),
}
DEVICES = (
    DeviceSpec(name="gpu0", kind="gpu", total_bytes=24 * GIB, reserve_bytes=GIB),
    DeviceSpec(name="gpu1", kind="gpu", total_bytes=24 * GIB, exclusive=True),
    DeviceSpec(name=HOST, kind="host", total_bytes=32 * GIB, reserve_bytes=2 * GIB),
)
BACKENDS = (
    BackendSpec(name="chat", gpus=("gpu0", "gpu1"), slots=2, idle_ttl_s=120.0),
    BackendSpec(name="big", gpus=("gpu0",)),
    BackendSpec(name="tts", gpus=("gpu0", "gpu1")),
    BackendSpec(name="wide", gpus=("gpu0", "gpu1"), gpu_count=2),
    BackendSpec(name="cpu", slots=2),
)
FRESH = BackendSpec(name="fresh", gpus=("gpu0",))


@dataclass
class Model:
    """What the engine knows about one backend."""

    state: str = "stopped"  # stopped, starting, ready, stopping
    inflight: set[str] = field(default_factory=set)
    gpus: tuple[str, ...] = ()
    measuring: bool = False
    dispatched_since_start: int = 0
    waiting_at_start: set[str] = field(default_factory=set)


APPS = ("radio", "chat", "batch")


class CoreMachine(RuleBasedStateMachine):
    faulty = False
    weights: ClassVar[Mapping[str, float] | None] = None
    config = SchedulerConfig(
        aging_rate=1.0,
        min_priority=0,
        max_priority=100,
        deadline_boost=50,
        urgency_window_s=20,
        batch_bound=2,
        queue_limit=8,
        default_service_s=5.0,
    )

    def __init__(self) -> None:
        super().__init__()
        backends = (*BACKENDS, FRESH) if self.faulty else BACKENDS
        self.s = Scheduler(DEVICES, backends, self.config, weights=self.weights)
        self.reference = Scheduler(
            DEVICES, backends, self.config, replan_everything=True, weights=self.weights
        )
        self.now = 0.0
        self.fed: list[tuple[float, Event]] = []
        self.log: list[tuple[float, Decision]] = []
        self.engine: list[tuple[float, int, Event]] = []
        self.seq = itertools.count()
        self.models = {b.name: Model() for b in backends}
        self.arrived: dict[str, float] = {}
        self.backend_of: dict[str, str] = {}
        self.service: dict[str, float] = {}
        self.attempt: dict[str, int] = {}
        self.ended: dict[str, int] = {}
        self.running: dict[str, str] = {}  # request -> backend
        self.lost: set[str] = set()
        self.waits: list[tuple[str, float]] = []
        self.ids = itertools.count()
        self.problems: list[str] = []
        self.pinned: dict[str, bool] = {}
        for name, (g, hst) in PROFILES.items():
            self.feed(
                ProfileMeasured(
                    backend=name,
                    gpu_bytes=g * GIB,
                    host_bytes=hst * GIB,
                    load_s=LOAD_S[name],
                    source="stored",
                )
            )

    # -- the simulated engine -----------------------------------------------------

    def later(self, delay: float, event: Event) -> None:
        heapq.heappush(self.engine, (self.now + delay, next(self.seq), event))

    def feed(self, event: Event) -> None:
        self.fed.append((self.now, event))
        out = self.s.handle(event, self.now)
        expected = self.reference.handle(event, self.now)
        assert out == expected, f"incremental planning differs from a full re-plan: {event!r}"
        self.log.extend((self.now, d) for d in out)
        for d in out:
            self.carry_out(d)

    def end(self, rid: str) -> None:
        self.ended[rid] = self.ended.get(rid, 0) + 1
        backend = self.running.pop(rid, None)
        if backend is not None:
            self.models[backend].inflight.discard(rid)
        self.lost.discard(rid)

    def carry_out(self, d: Decision) -> None:
        if not d.reason.strip():
            self.problems.append(f"no reason: {d!r}")
        if isinstance(d, StartBackend):
            m = self.models[d.backend]
            if m.state != "stopped":
                self.problems.append(f"start of {d.backend} while {m.state}")
            m.state, m.gpus, m.measuring = "starting", d.gpus, d.measure
            m.dispatched_since_start = 0
            m.waiting_at_start = {
                r
                for r, b in self.backend_of.items()
                if b == d.backend and r not in self.ended and r not in self.running
            }
            self.later(LOAD_S[d.backend], BackendReady(backend=d.backend))
        elif isinstance(d, StopBackend):
            m = self.models[d.backend]
            if m.state != "ready" or m.inflight:
                self.problems.append(f"stop of {d.backend} while {m.state} {m.inflight}")
            if (
                "making room" in d.reason
                and m.dispatched_since_start == 0
                and any(r not in self.ended for r in m.waiting_at_start)
            ):
                self.problems.append(f"{d.backend} evicted before serving: {d.reason}")
            m.state = "stopping"
            self.later(1.0, BackendStopped(backend=d.backend))
        elif isinstance(d, Dispatch):
            m = self.models[d.backend]
            slots = next(b.slots for b in (*BACKENDS, FRESH) if b.name == d.backend)
            if m.state != "ready" or len(m.inflight) >= slots:
                self.problems.append(f"dispatch to {d.backend} while {m.state} {m.inflight}")
            m.inflight.add(d.request_id)
            m.dispatched_since_start += 1
            self.running[d.request_id] = d.backend
            self.waits.append((d.request_id, self.now - self.arrived[d.request_id]))
            self.attempt[d.request_id] = self.attempt.get(d.request_id, 0) + 1
            self.later(
                self.service[d.request_id],
                RequestFinished(request_id=d.request_id, detail=str(self.attempt[d.request_id])),
            )
        elif isinstance(d, Reject):
            self.end(d.request_id)
        elif isinstance(d, Requeue):
            backend = self.running.pop(d.request_id)
            self.models[backend].inflight.discard(d.request_id)
            self.lost.discard(d.request_id)

    def deliver(self, event: Event) -> None:
        if isinstance(event, BackendReady):
            m = self.models[event.backend]
            if m.state != "starting":
                return
            m.state = "ready"
            self.feed(event)
            if m.measuring:
                m.measuring = False
                g, hst = PROFILES.get(event.backend, (5, 1))
                self.feed(
                    ProfileMeasured(
                        backend=event.backend, gpu_bytes=g * GIB, host_bytes=hst * GIB, load_s=None
                    )
                )
        elif isinstance(event, BackendStopped):
            self.models[event.backend].state = "stopped"
            self.feed(event)
        elif isinstance(event, RequestFinished):
            rid = event.request_id
            if rid not in self.running or str(self.attempt.get(rid)) != event.detail:
                return  # cancelled, failed or requeued meanwhile
            if rid in self.lost:
                return
            self.end(rid)  # its slot is free before the core hears of it
            self.feed(event)
        else:
            self.feed(event)

    def advance_to(self, target: float) -> None:
        for _ in range(10_000):
            wake = self.s.next_wakeup()
            nxt = self.engine[0][0] if self.engine else None
            times = [t for t in (wake, nxt) if t is not None and t <= target]
            if not times:
                break
            t = min(times)
            self.now = max(self.now, t)
            if nxt is not None and nxt == t:
                _, _, event = heapq.heappop(self.engine)
                self.deliver(event)
            else:
                self.feed(Tick())
        self.now = max(self.now, target)

    # -- what Hypothesis chooses ---------------------------------------------------

    @rule(
        backend=st.sampled_from([*(b.name for b in BACKENDS for _ in range(3)), "fresh", "nope"]),
        priority=st.sampled_from([0, 10, 50, 90, 100]),
        service=st.floats(min_value=0.5, max_value=MAX_SERVICE_S),
        deadline=st.none() | st.floats(min_value=0, max_value=300),
        allow_late=st.booleans(),
        app=st.sampled_from(APPS),
    )
    def arrive(
        self,
        backend: str,
        priority: int,
        service: float,
        deadline: float | None,
        allow_late: bool,
        app: str,
    ) -> None:
        if backend == "fresh" and not self.faulty:
            backend = "tts"
        rid = f"r{next(self.ids)}"
        self.arrived[rid] = self.now
        self.backend_of[rid] = backend
        self.service[rid] = service
        self.feed(
            RequestArrived(
                request_id=rid,
                backend=backend,
                priority=priority,
                start_by=None if deadline is None else self.now + deadline,
                allow_late=allow_late,
                app=app,
            )
        )

    @rule(dt=st.floats(min_value=0.1, max_value=60))
    def advance(self, dt: float) -> None:
        self.advance_to(self.now + dt)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        live = sorted(r for r in self.arrived if r not in self.ended)
        if not live:
            return
        rid = data.draw(st.sampled_from(live))
        self.end(rid)
        self.feed(RequestCancelled(request_id=rid))

    @rule(foreign_gib=st.integers(min_value=0, max_value=6))
    def meter_reading(self, foreign_gib: int) -> None:
        """Every device read: loaded backends use their profile; the faulty
        machine adds foreign memory."""
        for dev in DEVICES:
            backends = []
            for name, m in sorted(self.models.items()):
                if m.state != "ready" or name not in PROFILES:
                    continue
                g, hst = PROFILES[name]
                if dev.name == HOST:
                    backends.append((name, hst * GIB))
                elif dev.name in m.gpus:
                    backends.append((name, g * GIB))
            foreign = foreign_gib * GIB if self.faulty else 0
            used = sum(n for _, n in backends) + foreign
            self.feed(MemoryMeasured(device=dev.name, used_bytes=used, backends=tuple(backends)))

    # -- faults (the faulty machine only) ------------------------------------------

    @precondition(lambda self: self.faulty)
    @rule(data=st.data(), oom=st.booleans())
    def crash(self, data: st.DataObject, oom: bool) -> None:
        ready = sorted(n for n, m in self.models.items() if m.state == "ready")
        if not ready:
            return
        name = data.draw(st.sampled_from(ready))
        m = self.models[name]
        m.state = "stopped"
        self.feed(BackendExited(backend=name, exit_code=-9 if oom else 1, oom=oom))
        for rid in sorted(m.inflight):  # the core failed or requeued every one of them
            if rid in self.running:
                self.problems.append(f"{rid} left running on crashed {name}")
        m.inflight.clear()

    @precondition(lambda self: self.faulty)
    @rule(
        backend=st.sampled_from([b.name for b in BACKENDS]),
        action=st.sampled_from(["load", "unload", "pin", "unpin", "forget"]),
    )
    def admin(self, backend: str, action: str) -> None:
        if action == "load":
            self.feed(AdminLoad(backend=backend))
        elif action == "unload":
            self.feed(AdminUnload(backend=backend))
        elif action == "forget":
            self.feed(AdminForgetProfile(backend=backend))
        else:
            self.feed(AdminPin(backend=backend, pinned=action == "pin"))
            self.pinned[backend] = action == "pin"

    @precondition(lambda self: self.faulty)
    @rule(data=st.data())
    def lose_connection(self, data: st.DataObject) -> None:
        running = sorted(r for r in self.running if r not in self.lost)
        if not running:
            return
        rid = data.draw(st.sampled_from(running))
        self.lost.add(rid)
        self.feed(RequestFinished(request_id=rid, outcome="upstream_lost"))

    # -- promises -----------------------------------------------------------------

    @invariant()
    def nothing_went_wrong_in_the_engine(self) -> None:
        assert not self.problems, self.problems

    @invariant()
    def incremental_planning_matches_a_full_replan(self) -> None:
        # Views carry every backend's and request's reason (the plan's words), the
        # states and the estimated starts: all must match the reference's.
        assert self.s.snapshot(self.now) == self.reference.snapshot(self.now)

    @invariant()
    def memory_is_never_over_committed(self) -> None:
        snap = self.s.snapshot(self.now, limit=0)
        for dev in snap.devices:
            usable = dev.total_bytes - dev.reserve_bytes
            assert dev.committed_bytes <= usable, (dev.name, dev.committed_bytes, usable)
        for name, m in self.models.items():
            if m.measuring and m.state != "stopped":
                for other, o in self.models.items():
                    if other != name and o.state != "stopped":
                        assert not set(o.gpus) & set(m.gpus), (name, other)
        for spec in DEVICES:
            if spec.exclusive:
                on = [
                    n
                    for n, m in self.models.items()
                    if m.state != "stopped" and spec.name in m.gpus
                ]
                assert len(on) <= 1, (spec.name, on)

    @invariant()
    def every_request_ends_exactly_once(self) -> None:
        assert all(n == 1 for n in self.ended.values()), self.ended
        for rid in self.arrived:
            if rid in self.ended or rid in self.running:
                continue
            assert self.s.explain(rid, self.now) is not None, f"{rid} vanished"

    @invariant()
    def no_wait_exceeds_the_bound(self) -> None:
        if self.faulty:
            return
        bound = self.s.wait_bound(max_service_s=MAX_SERVICE_S)
        assert bound is not None
        for rid, waited in self.waits:
            assert waited <= bound, (rid, waited, bound)
        for rid, t in self.arrived.items():
            if rid not in self.ended and rid not in self.running:
                assert self.now - t <= bound, (rid, self.now - t, bound)

    @invariant()
    def weights_take_at_most_the_band(self) -> None:
        # What the bound's proof rests on: a request ranks no more than
        # share_points below (and never above) its aged priority, plus the boost.
        c = self.config
        band = c.share_points if self.weights else 0.0
        for view in self.s.snapshot(self.now).queue:
            aged = view.priority + c.aging_rate * (self.now - view.arrived_at)
            assert aged - band - 1e-6 <= view.effective_priority, (view, band)
            assert view.effective_priority <= aged + c.deadline_boost + 1e-6, view

    def teardown(self) -> None:
        # Nothing is stuck: with no new arrivals (and the foreign memory gone)
        # every request ends.
        self.meter_reading(0)
        for name, pinned in sorted(self.pinned.items()):
            if pinned:  # a pinned backend may hold memory others wait for
                self.feed(AdminPin(backend=name, pinned=False))
        self.advance_to(self.now + 5_000)
        stuck = sorted(r for r in self.arrived if r not in self.ended)
        assert not stuck, [(r, self.s.explain(r, self.now)) for r in stuck[:3]]
        self.nothing_went_wrong_in_the_engine()
        backends = [*BACKENDS, FRESH] if self.faulty else BACKENDS
        replay = Scheduler(DEVICES, backends, self.config, weights=self.weights)
        again = [(t, d) for t, e in self.fed for d in replay.handle(e, t)]
        assert again == self.log


class FaultyCoreMachine(CoreMachine):
    faulty = True


class TightCoreMachine(CoreMachine):
    """Fast aging and a short queue: the wait bound is at its tightest."""

    config = SchedulerConfig(
        aging_rate=10.0,
        min_priority=0,
        max_priority=100,
        deadline_boost=20,
        urgency_window_s=5,
        batch_bound=1,
        queue_limit=4,
        default_service_s=5.0,
    )


class WeightedCoreMachine(CoreMachine):
    """App weights on: batch has a quarter of the share, radio twice."""

    weights: ClassVar[Mapping[str, float] | None] = MappingProxyType({"radio": 2.0, "batch": 0.25})
    config = SchedulerConfig(
        aging_rate=1.0,
        min_priority=0,
        max_priority=100,
        deadline_boost=50,
        urgency_window_s=20,
        batch_bound=2,
        queue_limit=8,
        default_service_s=5.0,
        share_points=40.0,
    )


class TightWeightedCoreMachine(TightCoreMachine):
    """Fast aging, a short queue and a band wider than the priorities' range."""

    weights: ClassVar[Mapping[str, float] | None] = MappingProxyType({"radio": 2.0, "batch": 0.25})
    config = SchedulerConfig(
        aging_rate=10.0,
        min_priority=0,
        max_priority=100,
        deadline_boost=20,
        urgency_window_s=5,
        batch_bound=1,
        queue_limit=4,
        default_service_s=5.0,
        share_points=150.0,
    )


TestCore = CoreMachine.TestCase
TestCore.settings = settings(
    max_examples=int(os.environ.get("YARD_CORE_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTightCore = TightCoreMachine.TestCase
TestTightCore.settings = TestCore.settings
TestWeightedCore = WeightedCoreMachine.TestCase
TestWeightedCore.settings = TestCore.settings
TestTightWeightedCore = TightWeightedCoreMachine.TestCase
TestTightWeightedCore.settings = TestCore.settings
TestFaultyCore = FaultyCoreMachine.TestCase
TestFaultyCore.settings = settings(
    max_examples=int(os.environ.get("YARD_CORE_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
