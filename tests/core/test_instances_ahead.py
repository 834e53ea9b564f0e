"""Several instances of one backend and work ahead: an announced window that needs
more slots than the first instance has readies the further instances too (where
memory allows without evicting work that ranks higher, and never for a first
load)."""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import replace

import pytest

from tests.core.harness import GIB, Harness, gpu, host, of
from tests.core.test_instances_random import BACKENDS, PROFILES, SERVICE, play_twins
from yard.core import (
    AnnouncementMade,
    BackendSpec,
    Decision,
    Dispatch,
    Event,
    ProfileMeasured,
    Reject,
    RequestArrived,
    Scheduler,
    SchedulerConfig,
    StartBackend,
    StopBackend,
)

NEWS = BackendSpec(name="news", gpus=("gpu0", "gpu1"), instances=2, spread_windows=True)
NEWS_2 = BackendSpec(
    name="news@2", gpus=("gpu0", "gpu1"), instances=2, instance_of="news", spread_windows=True
)
LOAD_S = 40.0
OPENS = 1000.0
NEAR = OPENS - LOAD_S - 2.0  # the load time and the lead margin before it opens


def harness(
    *extra: BackendSpec,
    profiles: dict[str, tuple[float, float, float]] | None = None,
    reference: bool = False,
    specs: tuple[BackendSpec, ...] = (NEWS, NEWS_2),
) -> Harness:
    """Two 24 GiB GPUs, news on either (14 GiB, a 40 s load) as two instances.
    ``reference``: its scheduler plans every load afresh on every event."""
    backends = [*specs, *extra]
    devices = (gpu("gpu0"), gpu("gpu1"), host())
    h = Harness(backends, devices=devices)
    if reference:
        h.s = Scheduler(devices, backends, SchedulerConfig(), replan_everything=True)
    for name, (g, m, load) in (profiles if profiles is not None else {"news": (14, 2, 40)}).items():
        h.feed(
            ProfileMeasured(
                backend=name,
                gpu_bytes=int(g * GIB),
                host_bytes=int(m * GIB),
                load_s=load,
                source="stored",
            )
        )
    return h


def announce(count: int, at: float = 0.0) -> AnnouncementMade:
    return AnnouncementMade(
        announcement_id="a1",
        app="radio",
        backend="news",
        not_before=OPENS,
        start_by=OPENS + 600,
        count=count,
        priority=90,
        label="13:50",
    )


def script(rid: str) -> RequestArrived:
    return RequestArrived(request_id=rid, backend="news", priority=90, app="radio")


def starts(h: Harness) -> list[tuple[float, str, str]]:
    return [(t, d.backend, d.reason) for t, d in h.log if isinstance(d, StartBackend)]


@pytest.mark.parametrize("reference", [False, True])
def test_an_announcement_beyond_the_first_instances_slots_readies_the_second(
    reference: bool,
) -> None:
    h = harness(reference=reference)
    h.feed(announce(3), at=0)
    arrivals = [(OPENS + k, script(f"r{k + 1}")) for k in range(3)]
    h.play(arrivals, {"r1": 90.0, "r2": 90.0, "r3": 90.0}, until=OPENS + 600)
    [(t1, b1, _), (t2, b2, why2)] = starts(h)
    assert (t1, b1) == (NEAR, "news")
    assert (t2, b2) == (NEAR, "news@2")  # on the other GPU, at once
    assert why2.startswith(
        "starting news@2: loading news@2 now: 3 announced requests from 13:50 (a1), "
        "more than news's 1 slot; placed on gpu1"
    )
    # The window's second script finds news@2 ready: no load inside its wait.
    assert h.dispatch_times() == [(OPENS, "r1"), (OPENS + 1, "r2"), (OPENS + 90, "r3")]


def test_without_spread_windows_a_window_readies_the_first_instance_alone() -> None:
    h = harness(specs=tuple(replace(s, spread_windows=False) for s in (NEWS, NEWS_2)))
    h.feed(announce(3), at=0)
    arrivals = [(OPENS + k, script(f"r{k + 1}")) for k in range(3)]
    h.play(arrivals, {"r1": 90.0, "r2": 90.0, "r3": 90.0}, until=OPENS + 600)
    # The window readies news alone; news@2 would load only for a script that
    # finds news busy for longer than a load (here the core expects a short wait).
    assert [(t, b) for t, b, _ in starts(h)] == [(NEAR, "news")]
    assert h.dispatch_times() == [(OPENS, "r1"), (OPENS + 90, "r2"), (OPENS + 180, "r3")]


def test_the_incremental_planning_equals_planning_everything_afresh() -> None:
    logs = []
    for reference in (False, True):
        h = harness(reference=reference)
        h.feed(announce(3), at=0)
        arrivals = [(OPENS + k, script(f"r{k + 1}")) for k in range(3)]
        h.play(arrivals, {"r1": 90.0, "r2": 90.0, "r3": 90.0}, until=OPENS + 900)
        logs.append(h.log)
    assert logs[0] == logs[1]


def test_an_announcement_the_first_instances_slots_take_readies_no_second() -> None:
    h = harness()
    h.feed(announce(1), at=0)
    h.play([(OPENS, script("r1"))], {"r1": 90.0}, until=OPENS + 600)
    assert [b for _, b, _ in starts(h)] == ["news"]


def test_a_second_slot_of_the_first_instance_counts() -> None:
    two_slots = tuple(replace(s, slots=2) for s in (NEWS, NEWS_2))
    h = harness(specs=two_slots)
    h.feed(announce(2), at=0)
    h.tick(NEAR)
    assert [b for _, b, _ in starts(h)] == ["news"]
    h = harness(specs=two_slots)
    h.feed(announce(3), at=0)
    h.tick(NEAR)
    assert [b for _, b, _ in starts(h)] == ["news", "news@2"]


def test_the_second_instance_evicts_no_work_that_ranks_higher() -> None:
    chat = BackendSpec(name="chat", gpus=("gpu1",))
    h = harness(chat, profiles={"news": (14, 2, 40), "chat": (14, 2, 20)})
    [start] = of(StartBackend, h.arrive("c1", "chat", priority=99, at=0))
    assert start.gpus == ("gpu1",)
    h.ready("chat", at=20)
    h.arrive("c2", "chat", priority=99, at=21)  # waits for chat's one slot, ranked above
    h.feed(announce(3), at=30)
    out = h.tick(NEAR)
    [start] = of(StartBackend, out)
    assert (start.backend, start.gpus) == ("news", ("gpu0",))
    assert not of(StopBackend, out)
    assert h.state("news@2") == "stopped"
    assert h.state("chat") == "ready"


def test_an_idle_backend_ranked_lower_makes_room_for_the_second_instance() -> None:
    chat = BackendSpec(name="chat", gpus=("gpu1",))
    h = harness(chat, profiles={"news": (14, 2, 40), "chat": (14, 2, 20)})
    h.arrive("c1", "chat", priority=50, at=0)
    h.ready("chat", at=20)
    h.finish("c1", at=25)
    h.feed(announce(3), at=30)
    out = h.tick(NEAR)
    assert [d.backend for d in of(StartBackend, out)] == ["news"]
    [stop] = of(StopBackend, out)
    assert stop.backend == "chat"
    assert "news@2" in stop.reason
    [start2] = of(StartBackend, h.stopped("chat", at=NEAR + 1))
    assert (start2.backend, start2.gpus) == ("news@2", ("gpu1",))


def test_a_further_instance_takes_no_first_load_for_a_window() -> None:
    h = harness(profiles={})
    h.feed(announce(3), at=0)
    near = OPENS - 30.0 - 2.0  # the default load time: nothing measured yet
    [start] = of(StartBackend, h.tick(near))
    assert start.backend == "news" and start.measure
    h.ready("news", at=near + 35)
    assert h.state("news@2") == "stopped"
    # The first load measured the profile they share: now the second loads ahead.
    out = h.feed(
        ProfileMeasured(backend="news", gpu_bytes=14 * GIB, host_bytes=2 * GIB, load_s=35.0),
        at=near + 36,
    )
    [start2] = of(StartBackend, out)
    assert start2.backend == "news@2" and not start2.measure
    assert start2.gpus != start.gpus


def test_a_second_instance_that_fails_to_start_is_not_loaded_again_for_the_window() -> None:
    h = harness()
    h.feed(announce(3), at=0)
    h.tick(NEAR)
    assert h.state("news@2") == "starting"
    assert not of(StartBackend, h.start_failed("news@2", at=NEAR + 5))
    assert not of(StartBackend, h.tick(NEAR + 60))
    assert h.state("news@2") == "failed"


def test_a_second_instance_loaded_for_a_window_is_kept_until_it_ends() -> None:
    h = harness(specs=(replace(NEWS, idle_ttl_s=60), replace(NEWS_2, idle_ttl_s=60)))
    h.feed(announce(3), at=0)
    h.tick(NEAR)
    h.ready("news", at=NEAR + 40)
    h.ready("news@2", at=NEAR + 40)
    out = h.tick(NEAR + 200)  # idle past its ttl, the window not used yet
    assert not of(StopBackend, out)
    assert h.state("news@2") == "ready"


# -- random days with announcements ----------------------------------------------------


def run_announced_day(seed: int) -> tuple[list[tuple[float, Decision]], int]:
    """A random two hours of :mod:`tests.core.test_instances_random`'s machine
    with announced news windows (1-4 requests each, some never sent), played on
    a scheduler and a re-planning reference that must agree on every event;
    return the decisions and how many requests arrived."""
    rng = random.Random(seed)
    devices = (gpu("gpu0"), gpu("gpu1"), host())
    config = SchedulerConfig(default_service_s=30.0)
    backends = [replace(b, spread_windows=b.name.startswith("news")) for b in BACKENDS]
    s = Scheduler(devices, backends, config)
    reference = Scheduler(devices, backends, config, replan_everything=True)
    seq = itertools.count()
    pending: list[tuple[float, int, Event]] = []
    for name, (g, m, load) in PROFILES.items():
        profile = ProfileMeasured(
            backend=name, gpu_bytes=g * GIB, host_bytes=m * GIB, load_s=load, source="stored"
        )
        heapq.heappush(pending, (0.0, next(seq), profile))
    service: dict[str, float] = {}
    arrivals = 0
    for w in range(rng.randint(2, 6)):
        opens = rng.uniform(300.0, 6600.0)
        count = rng.randint(1, 4)
        made = AnnouncementMade(
            announcement_id=f"a{w}",
            app="radio",
            backend="news",
            not_before=opens,
            start_by=opens + 600.0,
            count=count,
            priority=rng.choice([50, 90]),
            label=f"w{w}",
        )
        heapq.heappush(pending, (max(0.0, opens - rng.uniform(60, 900)), next(seq), made))
        for k in range(rng.randint(0, count)):
            rid = f"w{w}-{k}"
            service[rid] = SERVICE["news"] * rng.uniform(0.5, 1.5)
            at = opens + rng.uniform(0, 300.0)
            script = RequestArrived(request_id=rid, backend="news", priority=90, app="radio")
            heapq.heappush(pending, (at, next(seq), script))
            arrivals += 1
    for i in range(rng.randint(10, 40)):
        backend = rng.choice(["news", "chat", "chat", "music"])
        rid = f"r{i:03d}"
        service[rid] = SERVICE[backend] * rng.uniform(0.5, 1.5)
        arrival = RequestArrived(request_id=rid, backend=backend, priority=rng.choice([10, 50, 95]))
        heapq.heappush(pending, (rng.uniform(0, 7200.0), next(seq), arrival))
        arrivals += 1
    return play_twins(s, reference, pending, seq, service), arrivals


@pytest.mark.parametrize("seed", range(12))
def test_random_announced_days_keep_the_promises_with_instances(seed: int) -> None:
    log, arrivals = run_announced_day(seed)
    ended: dict[str, int] = {}
    for _, d in log:
        if isinstance(d, Dispatch | Reject) and d.request_id is not None:
            ended[d.request_id] = ended.get(d.request_id, 0) + 1
    assert sum(ended.values()) == arrivals == len(ended), "each request ends exactly once"
    for _, d in log:
        if isinstance(d, StopBackend) and d.backend.startswith("news"):
            assert "room for news" not in d.reason, d.reason
        if isinstance(d, StartBackend):
            assert d.backend != "news@3", "two 14 GiB copies fill the two GPUs"


def test_the_random_announced_days_ready_second_instances_ahead() -> None:
    ahead = [
        d
        for seed in range(12)
        for _, d in run_announced_day(seed)[0]
        if isinstance(d, StartBackend) and d.backend == "news@2" and "now:" in d.reason
    ]
    assert ahead
    assert all("more than news's 1 slot" in d.reason for d in ahead)
