"""The fake engine against the real one (the real core over fake backend
processes), on virtual time: where the tests above the engine lean on the
fake, it must end a request as the real engine does."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

import pytest
import trio
import trio.testing

from yard.admission import AdmissionLike, Assignment, UpstreamLost, run_turn
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.engine import Engine
from yard.errors import Rejected
from yard.testing.engine import FakeEngine
from yard.testing.ports import FakeLauncher, Script


class Submits(Protocol):
    def submit(
        self, *, backend: str, priority: float, app: str = "", request_id: str | None = None
    ) -> AdmissionLike: ...


Running = AbstractAsyncContextManager[tuple[Submits, Callable[[], None]]]
"""An engine serving tts (ready at once, or still loading) and how to stop it."""


@asynccontextmanager
async def real(*, loading: bool = False) -> AsyncIterator[tuple[Submits, Callable[[], None]]]:
    """The real engine and core, tts ready when first asked for (or 100 s
    later); the second item stops the engine."""
    scheduler = Scheduler(
        [DeviceSpec(name="host", kind="host", total_bytes=64 * 2**30)],
        [BackendSpec(name="tts", slots=1)],
        SchedulerConfig(),
    )
    script = Script(ready_after_s=100.0 if loading else 0.0, stop_s=0.0)
    engine = Engine(scheduler=scheduler, launcher=FakeLauncher({"tts": script}))
    async with trio.open_nursery() as nursery:
        stop = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[None]) -> None:
            with stop:
                await engine.run(task_status=task_status)

        await nursery.start(run)
        yield engine, stop.cancel
        stop.cancel()


@asynccontextmanager
async def fake(*, loading: bool = False) -> AsyncIterator[tuple[Submits, Callable[[], None]]]:
    """The fake, playing the simple core the data plane's tests use (a
    backend still loading is one it holds)."""
    engine = FakeEngine({"tts": "http://tts"}, auto_dispatch=True, lost="fail")
    if loading:
        engine.hold.add("tts")
    yield engine, engine.shut_down


ENGINES = pytest.mark.parametrize("engine", [real, fake], ids=["real", "fake"])
Engines = Callable[..., Running]


async def _lost(assignment: Assignment) -> None:
    await trio.sleep(1)
    raise UpstreamLost("the backend closed the connection")


@ENGINES
async def test_a_request_whose_backend_breaks_off_ends_as_backend_failed(
    engine: Engines, autojump_clock: trio.testing.MockClock
) -> None:
    async with engine() as (submits, _):
        admission = submits.submit(backend="tts", priority=50, request_id="a")
        with pytest.raises(Rejected) as ended:
            await run_turn(admission, _lost)
    assert (ended.value.status, ended.value.code) == (502, "backend_failed")
    assert admission.state == "rejected"


@ENGINES
async def test_a_report_after_the_end_is_dropped_and_a_cancel_is_a_no_op(
    engine: Engines, autojump_clock: trio.testing.MockClock
) -> None:
    async with engine() as (submits, _):
        admission = submits.submit(backend="tts", priority=50, request_id="a")
        await admission.wait_dispatched()
        admission.report("ok")
        admission.report("error", "twice")
        admission.cancel()
        assert admission.state == "done"
        with pytest.raises(RuntimeError, match="already reported finished"):
            await admission.wait_dispatched()


@ENGINES
async def test_yard_stopping_ends_a_waiting_request_with_503_shutting_down(
    engine: Engines, autojump_clock: trio.testing.MockClock
) -> None:
    async with engine(loading=True) as (submits, stop):
        waiting = submits.submit(backend="tts", priority=50, request_id="a")
        await trio.sleep(1)
        stop()
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(Rejected) as ended:
            await waiting.wait_dispatched()
    assert (ended.value.status, ended.value.code) == (503, "shutting_down")
    assert ended.value.retry_after_s == 5.0


async def test_the_fake_sends_a_self_caused_loss_back_once_then_fails_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = FakeEngine({"tts": "http://tts"}, auto_dispatch=True, lost="requeue_once")
    admission = engine.submit(backend="tts", priority=50, request_id="a")
    with pytest.raises(Rejected) as ended:
        await run_turn(admission, _lost)
    assert ended.value.code == "backend_failed"
    assert [outcome for outcome, _ in admission.reports] == ["upstream_lost", "upstream_lost"]
    assert admission.dispatches == 2
    assert trio.current_time() == 2.0


async def test_by_hand_the_test_is_the_core_and_the_moves_are_the_real_ones(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = FakeEngine()
    admission = engine.submit(backend="tts", priority=70, request_id="a")
    await trio.sleep(5)
    (waiting,) = engine.snapshot().queue
    assert (waiting.request_id, waiting.effective_priority) == ("a", 75.0)
    with pytest.raises(AssertionError, match="cannot be requeued while queued"):
        engine.requeue("a")
    engine.dispatch("a", "http://elsewhere")
    assert admission.assignment == Assignment(
        request_id="a", backend="tts", base_url="http://elsewhere"
    )
    assert admission.queued_s == 5.0
    assert engine.statistics().inflight == 1
    with pytest.raises(AssertionError, match="cannot be dispatched while dispatched"):
        engine.dispatch("a")
    engine.reject("a", "backend_failed", 502, "tts crashed")
    with pytest.raises(Rejected, match="tts crashed"):
        await admission.wait_dispatched()
    assert engine.statistics().requests == {"rejected": 1}
