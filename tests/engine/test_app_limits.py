"""``[apps.NAME] max_queued`` in the engine, where every request is admitted:
an app's waiting requests are counted whatever holds them, one past its limit
is refused at once with 429 and a Retry-After, and refusals are counted by app
and code."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from yard.admission import Admission
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.engine import Engine
from yard.errors import Rejected
from yard.testing.ports import FakeLauncher, Script


@asynccontextmanager
async def engine(max_queued: dict[str, int]) -> AsyncIterator[Engine]:
    scheduler = Scheduler(
        [DeviceSpec(name="host", kind="host", total_bytes=64 * 2**30)],
        [BackendSpec(name="tts", slots=1)],
        SchedulerConfig(aging_rate=1.0),
    )
    launcher = FakeLauncher({"tts": Script(ready_after_s=5)})
    running = Engine(scheduler=scheduler, launcher=launcher, max_queued=max_queued)
    async with trio.open_nursery() as nursery:
        await nursery.start(running.run)
        yield running
        nursery.cancel_scope.cancel()


def submit(engine: Engine, app: str, arrived_at: float | None = None) -> Admission:
    return engine.submit(backend="tts", priority=50.0, app=app, arrived_at=arrived_at)


async def test_one_past_max_queued_is_refused_at_once_with_429_and_retry_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with engine({"radio": 2}) as e:
        waiting = [submit(e, "radio") for _ in range(2)]
        submit(e, "chat")  # another app is not held by radio's limit
        submitted = e.statistics().submitted
        with pytest.raises(Rejected) as info:
            submit(e, "radio")
        refused = info.value
        assert (refused.status, refused.code, refused.retry_after_s) == (
            429,
            "app_queue_full",
            1.0,  # none of radio's requests has started yet
        )
        assert refused.message == (
            "app 'radio' already has 2 requests waiting, the most [apps.radio] max_queued = 2 "
            "allows; try again after Retry-After seconds, once some of them have started"
        )
        stats = e.statistics()
        assert stats.submitted == submitted  # nothing was entered
        assert dict(stats.queued_by_app) == {"radio": 2, "chat": 1}
        assert stats.refusals == {"radio": {"app_queue_full": 1}}
        # A place frees when one leaves the queue.
        waiting[0].cancel()
        submit(e, "radio")
        with pytest.raises(Rejected):
            submit(e, "radio")
        assert stats.refusals == {"radio": {"app_queue_full": 1}}  # a snapshot
        assert e.statistics().refusals == {"radio": {"app_queue_full": 2}}


async def test_a_request_being_served_no_longer_counts_as_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with engine({"radio": 2}) as e:
        first = submit(e, "radio")
        # Requests of equal rank that arrive at the same instant go in request-id
        # order (random ids), so the second arrives a moment later.
        await trio.sleep(0.001)
        second = submit(e, "radio")
        await first.wait_dispatched()  # tts loaded after 5 s; one slot
        assert trio.current_time() == 5.0
        stats = e.statistics()
        assert (dict(stats.queued_by_app), dict(stats.inflight_by_app)) == (
            {"radio": 1},
            {"radio": 1},
        )
        third = submit(e, "radio")
        # Two wait; the first waited 5 s: one starts about every 5 / 2 s.
        with pytest.raises(Rejected) as info:
            submit(e, "radio")
        assert info.value.retry_after_s == 2.5
        first.report("ok")
        await second.wait_dispatched()
        second.report("ok")
        await third.wait_dispatched()
        third.report("ok")
        await trio.testing.wait_all_tasks_blocked()
        final = e.statistics()
        assert (final.queued_by_app, final.inflight_by_app) == ({}, {})


async def test_a_restored_request_is_counted_but_never_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with engine({"radio": 1}) as e:
        submit(e, "radio")
        submit(e, "radio", arrived_at=-100.0)  # a job restored after a restart
        assert e.statistics().queued_by_app == {"radio": 2}
        with pytest.raises(Rejected):
            submit(e, "radio")


async def test_the_cores_refusals_are_counted_by_app_and_code(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with engine({}) as e:
        refused = e.submit(backend="nope", priority=50.0, app="radio")
        with pytest.raises(Rejected):
            await refused.wait_dispatched()
        assert e.statistics().refusals == {"radio": {"model_not_found": 1}}
