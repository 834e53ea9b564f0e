"""``[apps.NAME] max_queued`` counts an app's jobs with its synchronous
requests (the engine admits both); a job past it is refused with 429 before
anything is stored."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from tests.jobs.harness import proxy_request, wall
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.engine import Engine
from yard.errors import Rejected
from yard.jobs.service import Jobs
from yard.jobs.store import JobStore
from yard.testing.ports import FakeLauncher, Script
from yard.testing.upstream import Answer, FakeUpstream


async def test_jobs_and_synchronous_requests_share_the_apps_max_queued(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    scheduler = Scheduler(
        [DeviceSpec(name="host", kind="host", total_bytes=64 * 2**30)],
        [BackendSpec(name="tts", slots=1)],
        SchedulerConfig(aging_rate=1.0),
    )
    engine = Engine(
        scheduler=scheduler,
        launcher=FakeLauncher({"tts": Script(ready_after_s=5)}),
        max_queued={"radio": 2},
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        store = await JobStore.open(tmp_path / "jobs.sqlite", threaded=False)
        jobs = Jobs(engine=engine, store=store, upstream=FakeUpstream(Answer()), wall=wall)
        try:
            await nursery.start(jobs.run)
            engine.submit(backend="tts", priority=50.0, app="radio")  # a synchronous one
            await jobs.submit(proxy_request(app="radio"), rerun_safe=False)
            with pytest.raises(Rejected) as info:
                await jobs.submit(proxy_request(app="radio"), rerun_safe=False)
            assert (info.value.status, info.value.code) == (429, "app_queue_full")
            assert "[apps.radio] max_queued = 2" in info.value.message
            assert info.value.retry_after_s == 1.0
            assert sum((await store.counts()).values()) == 1  # the refused job is not kept
            assert engine.statistics().refusals == {"radio": {"app_queue_full": 1}}
            # Another app's job is not held by radio's limit.
            await jobs.submit(proxy_request(app="news"), rerun_safe=False)
            nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await jobs.stop()
                await store.close()
