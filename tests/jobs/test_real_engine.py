"""The job service with the real engine and scheduler core, on virtual time
(fake backend processes and a fake upstream): aging counts across a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from tests.jobs.harness import proxy_request, wall
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.engine import Engine
from yard.jobs.service import Jobs
from yard.jobs.store import JobStore
from yard.testing.ports import FakeLauncher, Script
from yard.testing.upstream import Answer, FakeUpstream


@asynccontextmanager
async def yard(path: Path, upstream: FakeUpstream) -> AsyncIterator[Jobs]:
    """One run of yard's engine + jobs; leaving the block is a crash (nothing
    is finished on the way out that a SIGKILL would not finish)."""
    scheduler = Scheduler(
        [DeviceSpec(name="host", kind="host", total_bytes=64 * 2**30)],
        [BackendSpec(name="tts", slots=1)],
        SchedulerConfig(aging_rate=1.0),
    )
    engine = Engine(scheduler=scheduler, launcher=FakeLauncher({"tts": Script(ready_after_s=5)}))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        # Not threaded: a worker thread would let the mock clock jump.
        store = await JobStore.open(path / "jobs.sqlite", threaded=False)
        jobs = Jobs(engine=engine, store=store, upstream=upstream, wall=wall)
        try:
            await nursery.start(jobs.run)
            yield jobs
            nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await jobs.stop()
                await store.close()


async def test_a_restored_job_keeps_aging_from_its_first_arrival(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    upstream = FakeUpstream(Answer(delay=2.0))
    async with yard(tmp_path, upstream) as jobs:
        old = str((await jobs.submit(proxy_request(priority=10), rerun_safe=False))["id"])
        await trio.sleep(1)  # yard dies while tts is still loading
    assert upstream.calls == []

    await trio.sleep(100)
    async with yard(tmp_path, upstream) as jobs:
        restarted = trio.current_time()
        handed_in = await jobs.submit(proxy_request(priority=60), rerun_safe=False)
        # An idle engine places a request as it is submitted: the reason is
        # already the core's.
        assert handed_in["reason"] == (
            "behind 1 request(s) of higher effective priority for tts;"
            " waiting for tts to load (est. 30.0 s)"
        )
        new = str(handed_in["id"])
        await trio.sleep(0.5)  # the engine takes both in; tts is still loading
        shown = jobs.describe(await jobs.get(old, app="radio"))
        # Every second since its first arrival (at 0) counts: 10 + 101.5 or
        # more beats the newcomer's 60 + 0.5.
        assert shown["effective_priority"] == 10.0 + trio.current_time()
        assert shown["position"] == 0
        await jobs.wait_ended(new, app="radio")
    assert [call.request.request_id for call in upstream.calls] == [old, new]
    assert [call.at - restarted for call in upstream.calls] == [5.0, 7.0]
