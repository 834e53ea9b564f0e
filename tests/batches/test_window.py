"""The completion window on virtual time: the real engine and scheduler core,
the job service, a fake backend (each answer takes 1,000 s) and the batch
service, under ``MockClock(autojump_threshold=0)``.

A 1-hour window holds three 1,000 s lines on one slot: the first three run
and end inside the window, the others never start and end ``batch_expired``,
and the batch ends ``expired`` with the three answers in its output file.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing

from tests.batches.helpers import chat_line, jsonl
from tests.engine.fakes import FakeLauncher, Script
from tests.jobs.fakes import EPOCH, Answer, FakeUpstream, wall
from yard.batches.records import BatchRecord
from yard.batches.service import Batches
from yard.config import load_config
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.engine import Engine
from yard.jobs.service import Jobs
from yard.jobs.store import JobStore

SERVICE_S = 1000.0
CONFIG = """
[backends.llm]
command = ["true"]
models = ["tiny"]
slots = 1

[apps.alice]
key = "sk-alice"
default_priority = 50
max_priority = 80
"""


@asynccontextmanager
async def yard(path: Path, upstream: FakeUpstream) -> AsyncIterator[Batches]:
    (path / "yard.toml").write_text(CONFIG)
    config = load_config(path / "yard.toml")
    scheduler = Scheduler(
        [DeviceSpec(name="host", kind="host", total_bytes=64 * 2**30)],
        [BackendSpec(name="llm", slots=1)],
        SchedulerConfig(),
    )
    engine = Engine(scheduler=scheduler, launcher=FakeLauncher({"llm": Script(ready_after_s=5)}))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
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


async def _until_ended(batches: Batches, batch_id: str) -> BatchRecord:
    while True:
        batch = await batches.get(batch_id, app=None)
        if batch.ended:
            return batch
        await trio.sleep(10)


async def _content(batches: Batches, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await batches.store.content(file_id)
    assert content is not None
    return [json.loads(line) for line in content.splitlines()]


async def test_lines_that_cannot_finish_inside_the_window_expire_unstarted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    upstream = FakeUpstream(Answer(delay=SERVICE_S))
    async with yard(tmp_path, upstream) as batches:
        app = batches.config.apps["alice"]
        source = await batches.upload(
            app="alice",
            purpose="batch",
            filename="in.jsonl",
            content=jsonl([chat_line(f"r{i}") for i in range(6)]),
        )
        batch = await batches.create(
            app=app,
            input_file_id=source.id,
            endpoint="/v1/chat/completions",
            completion_window="1h",
            metadata=None,
            rerun_safe=False,
        )
        done = await _until_ended(batches, batch.id)
        output = await _content(batches, done.output_file_id)
        errors = await _content(batches, done.error_file_id)
        jobs, _ = await batches.jobs.list_jobs(app="alice", limit=100)
    assert done.status == "expired"
    assert done.expired_at is not None
    assert (done.total, done.completed, done.failed) == (6, 3, 3)
    assert [line["custom_id"] for line in output] == ["r0", "r1", "r2"]
    assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [
        ("r3", "batch_expired"),
        ("r4", "batch_expired"),
        ("r5", "batch_expired"),
    ]
    # Every answer came inside the window, and no expired line reached the backend.
    assert len(upstream.calls) == 3
    window_end = batch.expires_at - EPOCH
    assert all(call.at + SERVICE_S <= window_end for call in upstream.calls)
    ran = [job for job in jobs if job.started_at is not None]
    assert len(ran) == 3
    assert all(job.finished_at is not None and job.finished_at <= batch.expires_at for job in ran)
    # Until the first run was measured, one line at a time was handed in
    # (its start-by from the default service time); the rest had the measured one.
    by_id = {job.id: job for job in jobs}
    first = by_id[output[0]["response"]["request_id"]]
    assert first.start_by == batch.expires_at - SchedulerConfig().default_service_s
    assert by_id[output[1]["response"]["request_id"]].start_by == batch.expires_at - SERVICE_S
