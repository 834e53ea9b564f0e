"""The engine on virtual time, with a scripted policy and fake processes: every
assertion on time is exact."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing

from yard.core import BackendSpec, DeviceSpec, Scheduler
from yard.core.decisions import (
    Decision,
    Dispatch,
    Flag,
    ProfileRaised,
    Reject,
    Requeue,
    StartBackend,
    StopBackend,
)
from yard.core.events import (
    BackendExited,
    BackendReady,
    BackendStartFailed,
    BackendStopped,
    Event,
    MemoryMeasured,
    ProfileMeasured,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
    Tick,
)
from yard.core.spec import HOST, Profile
from yard.engine import Engine, LoggedDecision
from yard.errors import Rejected
from yard.ports import DeviceReading
from yard.testing.ports import (
    FakeLauncher,
    FakeMeter,
    FakeProcess,
    MemoryProfileStore,
    React,
    Script,
    ScriptedPolicy,
)

GiB = 1 << 30


def start_then_dispatch(backend: str = "llm") -> React:
    """A minimal policy: start the backend on the first request, dispatch every
    waiting request once it is ready (one slot is enough for these tests)."""
    waiting: list[str] = []
    state = {"started": False, "ready": False}

    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, RequestArrived):
            if state["ready"]:
                return [Dispatch(reason="ready", request_id=event.request_id, backend=backend)]
            waiting.append(event.request_id)
            if not state["started"]:
                state["started"] = True
                return [StartBackend(reason="needed", backend=backend, gpus=("gpu0",))]
        if isinstance(event, BackendReady):
            state["ready"] = True
            out: list[Decision] = [
                Dispatch(reason="ready", request_id=r, backend=backend) for r in waiting
            ]
            waiting.clear()
            return out
        if isinstance(event, RequestCancelled) and event.request_id in waiting:
            waiting.remove(event.request_id)
        return []

    return react


@dataclass
class Harness:
    engine: Engine
    policy: ScriptedPolicy
    launcher: FakeLauncher
    nursery: trio.Nursery


@asynccontextmanager
async def running(
    react: React | None = None,
    *,
    scripts: dict[str, Script] | None = None,
    meter: Callable[[FakeLauncher], FakeMeter] | None = None,
    profiles: MemoryProfileStore | None = None,
    backends: tuple[str, ...] = ("llm",),
    **engine_args: Any,
) -> AsyncIterator[Harness]:
    policy = ScriptedPolicy(react, backends)
    launcher = FakeLauncher(scripts)
    engine = Engine(
        scheduler=policy,
        launcher=launcher,
        meter=meter(launcher) if meter else None,
        profiles=profiles,
        **engine_args,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        yield Harness(engine, policy, launcher, nursery)
        nursery.cancel_scope.cancel()


async def test_request_waits_for_the_load_and_is_dispatched_when_the_backend_is_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(start_then_dispatch(), scripts={"llm": Script(ready_after_s=7.5)}) as h:
        t0 = trio.current_time()
        admission = h.engine.submit(backend="llm", priority=10, request_id="a")
        assignment = await admission.wait_dispatched()
        assert trio.current_time() - t0 == 7.5
        assert assignment.backend == "llm"
        assert assignment.base_url == "http://fake/llm/1000"
        assert admission.queued_s == 7.5
        assert h.launcher.launched == [(t0, "llm", ("gpu0",))]
        assert [type(e) for _, e in h.policy.seen] == [RequestArrived, BackendReady]
        assert h.policy.seen[1][0] - t0 == 7.5
        stats = h.engine.statistics()
        assert (stats.inflight, stats.queue_length, stats.loads) == (1, 0, 1)


async def test_report_tells_the_core_and_counts_the_outcome(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(start_then_dispatch()) as h:
        admission = h.engine.submit(backend="llm", priority=1, request_id="a")
        await admission.wait_dispatched()
        await trio.sleep(3)
        admission.report("ok")
        admission.report("error")  # a second report is ignored
        await trio.testing.wait_all_tasks_blocked()
        finished = h.policy.events_of(RequestFinished)
        assert finished == [(8.0, RequestFinished(request_id="a", outcome="ok"))]
        stats = h.engine.statistics()
        assert stats.requests == {"ok": 1}
        assert (stats.inflight, stats.queue_length) == (0, 0)
        with pytest.raises(RuntimeError):
            await admission.wait_dispatched()


async def test_cancel_while_queued_wakes_the_waiter_and_tells_the_core_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(start_then_dispatch(), scripts={"llm": Script(ready_after_s=60)}) as h:
        admission = h.engine.submit(backend="llm", priority=1, request_id="a")
        outcome: list[str] = []

        async def wait() -> None:
            try:
                await admission.wait_dispatched()
            except Rejected as exc:
                outcome.append(f"{exc.status} {exc.code} at {trio.current_time()}")

        h.nursery.start_soon(wait)
        await trio.sleep(2)
        admission.cancel()
        admission.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert outcome == ["499 cancelled at 2.0"]
        assert h.policy.events_of(RequestCancelled) == [(2.0, RequestCancelled(request_id="a"))]
        assert h.engine.statistics().requests == {"cancelled": 1}
        assert h.engine.statistics().queue_length == 0


async def test_cancel_after_dispatch_tells_the_core_and_a_later_report_is_ignored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(start_then_dispatch()) as h:
        admission = h.engine.submit(backend="llm", priority=1, request_id="a")
        await admission.wait_dispatched()
        admission.cancel()
        admission.report("ok")
        await trio.testing.wait_all_tasks_blocked()
        assert [type(e) for _, e in h.policy.seen] == [
            RequestArrived,
            BackendReady,
            RequestCancelled,
        ]
        assert h.engine.statistics().inflight == 0


async def test_tick_is_sent_exactly_at_the_cores_next_wakeup(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        h.policy.wakeup = 12.25
        h.engine.send(Tick())  # any event makes the loop ask again
        await trio.sleep(20)
        ticks = [t for t, e in h.policy.seen if isinstance(e, Tick)]
        # The first Tick is the one sent by hand at 0; then the engine's own, at
        # 12.25, and (the policy still asking for 12.25) one more 1 ms later.
        assert ticks[:3] == [0.0, 12.25, 12.25 + 0.001]
        h.policy.wakeup = None


async def test_a_backend_that_never_gets_ready_is_stopped_at_its_start_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(
        start_then_dispatch(),
        scripts={"llm": Script(ready_after_s=None, stop_s=2)},
        start_timeout_s=lambda backend: 45.0,
    ) as h:
        h.engine.submit(backend="llm", priority=1, request_id="a")
        await trio.sleep(100)
        failed = h.policy.events_of(BackendStartFailed)
        assert failed == [
            (
                47.0,
                BackendStartFailed(backend="llm", detail="llm did not become ready within 45 s"),
            )
        ]
        process = h.launcher.latest("llm")
        assert process.stopped_at == 47.0 and not process.alive
        assert h.engine.statistics().load_failures == 1
        assert h.engine.statistics().backends_running == 0


async def test_a_crash_while_loading_is_reported_with_its_oom_sign(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(
        start_then_dispatch(), scripts={"llm": Script(fail_after_s=3, fail_oom=True)}
    ) as h:
        h.engine.submit(backend="llm", priority=1, request_id="a")
        await trio.sleep(10)
        assert h.policy.events_of(BackendStartFailed) == [
            (3.0, BackendStartFailed(backend="llm", detail="crashed while loading", oom=True))
        ]
        assert h.engine.statistics().ooms == 1


async def test_a_launch_that_cannot_spawn_is_a_start_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(start_then_dispatch()) as h:
        h.launcher.refuse.add("llm")
        h.engine.submit(backend="llm", priority=1, request_id="a")
        await trio.sleep(1)
        assert h.policy.events_of(BackendStartFailed) == [
            (0.0, BackendStartFailed(backend="llm", detail="llm: no such executable"))
        ]


async def test_an_unasked_exit_after_ready_is_reported_as_exited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script(ready_after_s=5, exit_after_ready_s=20, exit_code=-9, exit_oom=True)
    async with running(start_then_dispatch(), scripts={"llm": script}) as h:
        h.engine.submit(backend="llm", priority=1, request_id="a")
        await trio.sleep(60)
        assert h.policy.events_of(BackendExited) == [
            (25.0, BackendExited(backend="llm", exit_code=-9, oom=True, detail="died"))
        ]
        assert h.policy.events_of(BackendStopped) == []
        assert h.engine.statistics().ooms == 1


async def test_stop_waits_for_the_process_and_reports_stopped_not_exited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, RequestArrived):
            return [StartBackend(reason="go", backend="llm")]
        if isinstance(event, BackendReady):
            return [StopBackend(reason="done with it", backend="llm")]
        return []

    async with running(react, scripts={"llm": Script(ready_after_s=5, stop_s=3)}) as h:
        h.engine.submit(backend="llm", priority=1, request_id="a")
        await trio.sleep(30)
        assert h.policy.events_of(BackendStopped) == [(8.0, BackendStopped(backend="llm"))]
        assert h.policy.events_of(BackendExited) == []
        stats = h.engine.statistics()
        assert (stats.stops, stats.evictions, stats.backends_running) == (1, 1, 0)


async def test_a_stop_during_start_up_ends_in_stopped_not_in_a_start_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, RequestArrived):
            return [StartBackend(reason="go", backend="llm")]
        if isinstance(event, RequestCancelled):
            return [StopBackend(reason="nobody needs it", backend="llm")]
        return []

    async with running(react, scripts={"llm": Script(ready_after_s=50, stop_s=1)}) as h:
        admission = h.engine.submit(backend="llm", priority=1, request_id="a")
        await trio.sleep(4)
        admission.cancel()
        await trio.sleep(100)
        assert [(t, type(e)) for t, e in h.policy.seen] == [
            (0.0, RequestArrived),
            (4.0, RequestCancelled),
            (5.0, BackendStopped),
        ]


async def test_after_a_requeue_the_stale_report_is_dropped_and_the_next_dispatch_returned(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, RequestArrived):
            return [StartBackend(reason="go", backend="llm")]
        if isinstance(event, BackendReady):
            return [Dispatch(reason="go", request_id="a", backend="llm")]
        if isinstance(event, BackendExited):
            return [
                Requeue(reason="yard over-committed", request_id="a"),
                StartBackend(reason="again", backend="llm"),
            ]
        return []

    scripts = {"llm": Script(ready_after_s=5, exit_after_ready_s=2, exit_oom=True)}
    async with running(react, scripts=scripts) as h:
        admission = h.engine.submit(backend="llm", priority=1, request_id="a")
        first = await admission.wait_dispatched()
        assert trio.current_time() == 5.0
        h.launcher.scripts["llm"] = Script(ready_after_s=5)
        await trio.sleep(3)
        admission.report("upstream_lost")  # already requeued at 7: dropped
        second = await admission.wait_dispatched()
        assert trio.current_time() == 12.0
        assert second.base_url != first.base_url
        assert admission.queued_s == 12.0
        admission.report("ok")
        await trio.testing.wait_all_tasks_blocked()
        assert [(t, type(e)) for t, e in h.policy.seen] == [
            (0.0, RequestArrived),
            (5.0, BackendReady),
            (7.0, BackendExited),
            (12.0, BackendReady),
            (12.0, RequestFinished),
        ]
        assert h.engine.statistics().requeues == 1


async def test_an_upstream_lost_report_waits_for_the_cores_verdict(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, RequestArrived):
            return [StartBackend(reason="go", backend="llm")]
        if isinstance(event, BackendReady):
            return [Dispatch(reason="go", request_id="a", backend="llm")]
        if isinstance(event, RequestFinished):
            return [
                Reject(reason="x", request_id="a", status=502, code="backend_failed", message="m")
            ]
        return []

    async with running(react) as h:
        admission = h.engine.submit(backend="llm", priority=1, request_id="a")
        await admission.wait_dispatched()
        admission.report("upstream_lost", "connection reset")
        # The engine was idle: the core heard the report at once, so its
        # verdict is already there (no task switch in between).
        assert admission.state == "rejected"
        with pytest.raises(Rejected) as caught:
            await admission.wait_dispatched()
        assert (caught.value.status, caught.value.code) == (502, "backend_failed")
        stats = h.engine.statistics()
        assert stats.requests == {"rejected": 1}
        assert stats.rejects == {"backend_failed": 1}
        assert (stats.queue_length, stats.inflight) == (0, 0)


async def test_a_rejected_request_raises_with_the_cores_status_and_code(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        assert isinstance(event, RequestArrived)
        return [
            Reject(
                reason="cannot start in time",
                request_id=event.request_id,
                status=503,
                code="deadline_missed",
                message="too late",
                retry_after_s=None,
            ),
            Flag(reason="just so you know"),
        ]

    async with running(react) as h:
        admission = h.engine.submit(backend="llm", priority=1, request_id="a", start_by=1.0)
        with pytest.raises(Rejected) as caught:
            await admission.wait_dispatched()
        assert caught.value.code == "deadline_missed"
        assert h.engine.statistics().deadline_misses == 1
        assert [type(d.decision) for d in h.engine.decisions()] == [Reject, Flag]


async def test_a_measured_first_load_reports_its_peak_and_stores_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Memory ramps to a 6 GiB peak at 3 s (warm-up), then settles at 5 GiB.
    def memory(t: float) -> dict[str, int]:
        gpu = 6 * GiB if 3 <= t < 4 else min(5 * GiB, int(t * 2 * GiB))
        return {"gpu0": gpu, HOST: GiB}

    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, RequestArrived):
            return [StartBackend(reason="first", backend="llm", gpus=("gpu0",), measure=True)]
        return []

    store = MemoryProfileStore()
    async with running(
        react,
        scripts={"llm": Script(ready_after_s=5, memory=memory)},
        meter=lambda launcher: FakeMeter({"gpu0": 24 * GiB, HOST: 64 * GiB}, launcher),
        profiles=store,
        meter_interval_s=100.0,
        profile_interval_s=0.25,
    ) as h:
        h.engine.submit(backend="llm", priority=1, request_id="a")
        await trio.sleep(10)
        # The launcher is told that this load is measured (it may fill a context).
        assert h.launcher.measured == [True]
        measured = [(t, e) for t, e in h.policy.seen if isinstance(e, ProfileMeasured)]
        assert measured == [
            (
                5.0,
                ProfileMeasured(
                    backend="llm",
                    gpu_bytes=6 * GiB,
                    host_bytes=GiB,
                    load_s=5.0,
                    source="measured",
                ),
            )
        ]
        ready_at = [t for t, e in h.policy.seen if isinstance(e, BackendReady)]
        assert ready_at == [5.0]
        # The profile reaches the core before the backend is reported ready.
        kinds = [type(e) for _, e in h.policy.seen if not isinstance(e, MemoryMeasured)]
        assert kinds.index(ProfileMeasured) < kinds.index(BackendReady)
        assert store.puts == [(5.0, "llm", Profile(gpu_bytes=6 * GiB, host_bytes=GiB, load_s=5.0))]


async def test_live_readings_reach_the_core_as_they_are_and_the_engine_raises_no_profile(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Whether use above the profile means anything is the core's to judge
    # (tests/core/test_memory.py); the engine reports readings, nothing more.
    def memory(t: float) -> dict[str, int]:
        return {"gpu0": 4 * GiB if t < 20 else 7 * GiB}

    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, RequestArrived):
            return [StartBackend(reason="known", backend="llm", gpus=("gpu0",))]
        return []

    store = MemoryProfileStore({"llm": Profile(gpu_bytes=5 * GiB, host_bytes=0, load_s=4.0)})
    async with running(
        react,
        scripts={"llm": Script(ready_after_s=4, memory=memory)},
        meter=lambda launcher: FakeMeter({"gpu0": 24 * GiB}, launcher),
        profiles=store,
        meter_interval_s=1.0,
    ) as h:
        h.engine.submit(backend="llm", priority=1, request_id="a")
        await trio.sleep(40)
        profiles = [(t, e) for t, e in h.policy.seen if isinstance(e, ProfileMeasured)]
        assert profiles == [
            (
                0.0,
                ProfileMeasured(
                    backend="llm", gpu_bytes=5 * GiB, host_bytes=0, load_s=4.0, source="stored"
                ),
            )
        ]
        assert store.puts == []
        readings = [e for _, e in h.policy.seen if isinstance(e, MemoryMeasured)]
        assert readings[-1] == MemoryMeasured(
            device="gpu0", used_bytes=7 * GiB, backends=(("llm", 7 * GiB),)
        )


async def test_live_use_above_the_profile_is_raised_once_by_the_core_and_stored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def memory(t: float) -> dict[str, int]:
        return {"gpu0": 4 * GiB if t < 20 else 7 * GiB}

    scheduler = Scheduler(
        [DeviceSpec(name="gpu0", kind="gpu", total_bytes=24 * GiB)],
        [BackendSpec(name="llm", gpus=("gpu0",))],
    )
    launcher = FakeLauncher({"llm": Script(ready_after_s=4, memory=memory)})
    store = MemoryProfileStore({"llm": Profile(gpu_bytes=5 * GiB, host_bytes=0, load_s=4.0)})
    engine = Engine(
        scheduler=scheduler,
        launcher=launcher,
        meter=FakeMeter({"gpu0": 24 * GiB}, launcher),
        profiles=store,
        meter_interval_s=1.0,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        engine.submit(backend="llm", priority=1, request_id="a")
        await trio.sleep(40)
        raised = [
            (d.at, d.decision.profile)
            for d in engine.decisions()
            if isinstance(d.decision, ProfileRaised)
        ]
        profile = Profile(gpu_bytes=7 * GiB, host_bytes=0, load_s=4.0)
        assert raised == [(20.0, profile)]
        assert store.puts == [(20.0, "llm", profile)]
        assert scheduler.profile("llm") == profile
        nursery.cancel_scope.cancel()


async def test_a_slow_subscriber_is_dropped_and_the_log_keeps_the_latest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        return [Flag(reason=f"flag {i}") for i in range(5)]

    async with running(react, log_size=3, subscriber_buffer=4) as h:
        feed = h.engine.subscribe()
        h.engine.send(Tick())
        await trio.testing.wait_all_tasks_blocked()
        assert [d.decision.reason for d in h.engine.decisions()] == ["flag 2", "flag 3", "flag 4"]
        received = [d.decision.reason async for d in feed]
        assert received == ["flag 0", "flag 1", "flag 2", "flag 3"]


async def test_an_idle_engine_takes_a_request_in_at_once_and_wakes_for_an_earlier_tick(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, RequestArrived):
            # "a" needs a wake-up at 3, "b" an earlier one, at 2.
            wake = now + (2.0 if event.request_id == "a" else 0.5)
            h.policy.wakeup = min(wake, h.policy.wakeup or math.inf)
        elif isinstance(event, Tick):
            h.policy.wakeup = None
        return []

    async with running(react) as h:
        await trio.sleep(1)
        h.engine.submit(backend="llm", priority=1, request_id="a")
        # Handled in submit itself: no task switch to the loop.
        assert [(t, type(e)) for t, e in h.policy.seen] == [(1.0, RequestArrived)]
        await trio.sleep(0.5)
        h.engine.submit(backend="llm", priority=1, request_id="b")
        await trio.sleep(5)
        assert [(t, type(e)) for t, e in h.policy.seen] == [
            (1.0, RequestArrived),
            (1.5, RequestArrived),
            (2.0, Tick),
        ]


async def test_a_request_submitted_behind_a_pending_event_is_handled_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, Tick):
            # Stopping a backend that is not running queues a BackendStopped.
            return [StopBackend(reason="test", backend="llm")]
        return []

    async with running(react) as h:
        await trio.sleep(1)
        h.engine.send(Tick())
        h.engine.submit(backend="llm", priority=1, request_id="a")
        assert [type(e) for _, e in h.policy.seen] == [Tick]
        await trio.testing.wait_all_tasks_blocked()
        assert [type(e) for _, e in h.policy.seen] == [Tick, BackendStopped, RequestArrived]


async def test_a_subscriber_gets_only_the_decision_kinds_it_asked_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, RequestArrived):
            return [
                StartBackend(reason="go", backend="llm"),
                Dispatch(reason="go", request_id=event.request_id, backend="llm"),
                Flag(reason="look"),
            ]
        return []

    async with running(react) as h:
        starts = h.engine.subscribe((StartBackend, Flag))
        everything = h.engine.subscribe()
        h.engine.submit(backend="llm", priority=1, request_id="a")
        await trio.testing.wait_all_tasks_blocked()
        assert [type(d.decision) for d in _drain(starts)] == [StartBackend, Flag]
        assert [type(d.decision) for d in _drain(everything)] == [StartBackend, Dispatch, Flag]


def _drain(feed: trio.MemoryReceiveChannel[LoggedDecision]) -> list[LoggedDecision]:
    received: list[LoggedDecision] = []
    while True:
        try:
            received.append(feed.receive_nowait())
        except trio.WouldBlock:
            return received


async def test_shutdown_stops_every_backend_and_ends_waiting_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, RequestArrived) and event.request_id == "a":
            return [StartBackend(reason="go", backend="llm")]
        if isinstance(event, BackendReady):
            return [Dispatch(reason="go", request_id="a", backend="llm")]
        return []

    launcher = FakeLauncher({"llm": Script(ready_after_s=1, stop_s=4)})
    engine = Engine(scheduler=ScriptedPolicy(react), launcher=launcher)
    outcomes: list[str] = []

    async def hold(request_id: str) -> None:
        admission = engine.submit(backend="llm", priority=1, request_id=request_id)
        try:
            await admission.wait_dispatched()
            await trio.sleep_forever()
        except Rejected as exc:
            outcomes.append(f"{request_id}: {exc.code}")

    engine_scope = trio.CancelScope()

    async def run_engine(*, task_status: trio.TaskStatus[None]) -> None:
        with engine_scope:
            await engine.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        await nursery.start(run_engine)
        nursery.start_soon(hold, "a")
        nursery.start_soon(hold, "b")
        await trio.sleep(10)
        engine_scope.cancel()
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    assert launcher.latest("llm").stopped_at == 14.0
    assert outcomes == ["b: shutting_down"]
    late = engine.submit(backend="llm", priority=1, request_id="c")
    assert late.state == "rejected"


async def test_a_profile_the_core_raised_after_an_oom_is_persisted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    raised = Profile(gpu_bytes=9 * GiB, host_bytes=GiB, load_s=4.0)

    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, Tick):
            return [ProfileRaised(reason="oom", backend="llm", profile=raised)]
        return []

    store = MemoryProfileStore()
    async with running(react, profiles=store) as h:
        await trio.sleep(3)
        h.engine.send(Tick())
        await trio.testing.wait_all_tasks_blocked()
        assert store.puts == [(3.0, "llm", raised)]
        assert [type(d.decision) for d in h.engine.decisions()] == [ProfileRaised]


async def test_a_dispatch_to_a_backend_that_is_not_ready_fails_the_request_loudly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, RequestArrived):
            return [Dispatch(reason="a core bug", request_id=event.request_id, backend="llm")]
        return []

    async with running(react) as h:
        admission = h.engine.submit(backend="llm", priority=1, request_id="a")
        with pytest.raises(Rejected) as caught:
            await admission.wait_dispatched()
        assert (caught.value.status, caught.value.code) == (502, "backend_failed")
        await trio.testing.wait_all_tasks_blocked()
        finished = h.policy.events_of(RequestFinished)
        assert finished == [
            (
                0.0,
                RequestFinished(
                    request_id="a", outcome="error", detail="backend llm was not ready"
                ),
            )
        ]
        assert (h.engine.statistics().queue_length, h.engine.statistics().inflight) == (0, 0)


async def test_a_stop_of_a_backend_the_engine_never_started_is_answered_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, Tick):
            return [StopBackend(reason="confused", backend="ghost")]
        return []

    async with running(react) as h:
        h.engine.send(Tick())
        await trio.testing.wait_all_tasks_blocked()
        assert h.policy.events_of(BackendStopped) == [(0.0, BackendStopped(backend="ghost"))]


async def test_backend_log_comes_from_the_logs_it_was_given(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Logs:
        def backend_log(self, backend: str) -> list[str]:
            return [f"{backend}: listening"]

    engine = Engine(scheduler=ScriptedPolicy(), launcher=FakeLauncher(), logs=Logs())
    assert engine.backend_log("llm") == ["llm: listening"]
    assert Engine(scheduler=ScriptedPolicy(), launcher=FakeLauncher()).backend_log("llm") == []


async def test_a_launcher_that_raises_fails_the_start_not_the_engine(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class BrokenLauncher(FakeLauncher):
        async def launch(
            self,
            backend: str,
            gpus: tuple[str, ...],
            *,
            measure: bool = False,
            context: int | None = None,
            parallel: int | None = None,
        ) -> FakeProcess:
            await trio.lowlevel.checkpoint()
            raise OSError(24, "Too many open files")

    policy = ScriptedPolicy(start_then_dispatch())
    engine = Engine(scheduler=policy, launcher=BrokenLauncher())
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        engine.submit(backend="llm", priority=1, request_id="a")
        await trio.sleep(1)
        failed = policy.events_of(BackendStartFailed)
        assert len(failed) == 1 and isinstance(failed[0][1], BackendStartFailed)
        assert failed[0][1].detail.startswith("could not start llm: OSError(24")
        assert engine.statistics().load_failures == 1
        nursery.cancel_scope.cancel()


async def test_a_meter_that_fails_to_read_is_skipped_and_the_engine_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class FlakyMeter(FakeMeter):
        async def read(self, pids: Mapping[str, int]) -> list[DeviceReading]:
            if len(self.reads) % 2 == 0:
                self.reads.append(trio.current_time())
                raise RuntimeError("NVML: GPU is lost")
            return await super().read(pids)

    async with running(
        start_then_dispatch(),
        meter=lambda launcher: FlakyMeter({"gpu0": 24 * GiB}, launcher),
        meter_interval_s=1.0,
    ) as h:
        admission = h.engine.submit(backend="llm", priority=1, request_id="a")
        await admission.wait_dispatched()
        await trio.sleep(0.5)
        readings = [t for t, e in h.policy.seen if isinstance(e, MemoryMeasured)]
        # Reads at 0, 1, 2, 3, 4, 5: every other one failed.
        assert readings == [1.0, 3.0, 5.0]


async def test_a_request_to_a_ready_backend_is_dispatched_inside_submit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(start_then_dispatch()) as h:
        first = h.engine.submit(backend="llm", priority=1, request_id="a")
        assert first.assignment is None  # the backend is still loading
        await first.wait_dispatched()
        second = h.engine.submit(backend="llm", priority=1, request_id="b")
        # No task switch needed: the caller can go to the backend at once.
        assert second.assignment is not None
        assert second.assignment.backend == "llm"
        assert await second.wait_dispatched() == second.assignment


async def test_an_idle_engine_hears_a_request_end_in_the_reporting_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(start_then_dispatch()) as h:
        admission = h.engine.submit(backend="llm", priority=1, request_id="a")
        await admission.wait_dispatched()
        admission.report("ok")
        # Before any checkpoint: the core has the event already.
        assert type(h.policy.seen[-1][1]) is RequestFinished
        assert h.engine.statistics().inflight == 0


async def test_an_event_raised_while_a_decision_is_applied_waits_for_the_loop(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def react(event: Event, now: float) -> list[Decision]:
        if isinstance(event, Tick):
            # Stopping a backend that is not running makes the engine send
            # BackendStopped while it applies this decision.
            return [StopBackend(reason="test", backend="llm"), Flag(reason="after the stop")]
        return []

    async with running(react) as h:
        h.engine.send(Tick())
        await trio.testing.wait_all_tasks_blocked()
        kinds = [type(e) for _, e in h.policy.seen]
        # Handled after the whole Tick (both decisions applied), not inside it.
        assert kinds == [Tick, BackendStopped]
        assert [type(d.decision) for d in h.engine.decisions()] == [StopBackend, Flag]


async def test_the_first_reading_is_told_before_the_engine_serves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A real meter's read takes a while (NVML in a thread, a busy machine); a
    # request that comes as soon as yard serves must meet a core that knows the
    # card is 20 of 24 GiB used by something else, not one that takes it for empty.
    class SlowMeter(FakeMeter):
        async def read(self, pids: Mapping[str, int]) -> list[DeviceReading]:
            await trio.sleep(0.2)
            return await super().read(pids)

    def busy(launcher: FakeLauncher) -> FakeMeter:
        meter = SlowMeter({"gpu0": 24 * GiB}, launcher)
        meter.set_foreign("gpu0", 20 * GiB)
        return meter

    async with running(start_then_dispatch(), meter=busy, meter_interval_s=1.0) as h:
        h.engine.submit(backend="llm", priority=1, request_id="a")
        await trio.testing.wait_all_tasks_blocked()
        first, second = (e for _, e in h.policy.seen[:2])
        assert first == MemoryMeasured(device="gpu0", used_bytes=20 * GiB, backends=())
        assert isinstance(second, RequestArrived)
        await trio.sleep(2.5)
        # Then every interval after the first: reads at 0.2, 1.4 and 2.6.
        reads = [t for t, e in h.policy.seen if isinstance(e, MemoryMeasured)]
        assert reads == pytest.approx([0.2, 1.4, 2.6])
