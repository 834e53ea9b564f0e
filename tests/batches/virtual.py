"""The batch service on virtual time: the real engine and scheduler core, the
job service with a fake upstream, fake backend processes, and the batch
service, under ``MockClock(autojump_threshold=0)``. Leaving :func:`yard` is a
crash: nothing is finished on the way out that a SIGKILL would not finish."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from tests.jobs.harness import wall
from yard.batches.records import BatchRecord
from yard.batches.service import Batches
from yard.config import load_config
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.engine import Engine
from yard.jobs.service import Jobs
from yard.jobs.store import JobStore
from yard.testing.ports import FakeLauncher, Script
from yard.testing.upstream import FakeUpstream

CONFIG = """
[backends.llm]
command = ["true"]
models = ["tiny"]
slots = 1

[backends.other]
command = ["true"]
models = ["small"]
slots = 1

[apps.alice]
key = "sk-alice"
default_priority = 50
max_priority = 80
"""


@asynccontextmanager
async def yard(
    path: Path, upstream: FakeUpstream, launcher: FakeLauncher | None = None
) -> AsyncIterator[Batches]:
    (path / "yard.toml").write_text(CONFIG)
    config = load_config(path / "yard.toml")
    scheduler = Scheduler(
        [DeviceSpec(name="host", kind="host", total_bytes=64 * 2**30)],
        [BackendSpec(name="llm", slots=1), BackendSpec(name="other", slots=1)],
        SchedulerConfig(),
    )
    scripts = {"llm": Script(ready_after_s=5), "other": Script(ready_after_s=5)}
    engine = Engine(scheduler=scheduler, launcher=launcher or FakeLauncher(scripts))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        # Not threaded: a worker thread would let the mock clock jump.
        store = await JobStore.open(path / "jobs.sqlite", threaded=False)
        jobs = Jobs(engine=engine, store=store, upstream=upstream, wall=wall)
        batches = Batches(jobs=jobs, config=config, wall=wall)
        try:
            await nursery.start(jobs.run)
            await nursery.start(batches.run)
            yield batches
            nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await batches.stop()
                await jobs.stop()
                await store.close()


async def submit(
    batches: Batches, content: bytes, *, window: str = "24h", rerun_safe: bool = False
) -> BatchRecord:
    """Upload ``content`` and create a batch from it, as app alice."""
    source = await batches.upload(
        app="alice", purpose="batch", filename="in.jsonl", content=content
    )
    return await batches.create(
        app=batches.config.apps["alice"],
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window=window,
        metadata=None,
        rerun_safe=rerun_safe,
    )


async def until_ended(batches: Batches, batch_id: str) -> BatchRecord:
    while True:
        batch = await batches.get(batch_id, app=None)
        if batch.ended:
            return batch
        await trio.sleep(10)


async def content(batches: Batches, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    data = await batches.store.content(file_id)
    assert data is not None
    return [json.loads(line) for line in data.splitlines()]
