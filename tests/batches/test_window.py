"""The completion window on virtual time (see :mod:`tests.batches.virtual`):
each answer of the fake backend takes 1,000 s.

A 1-hour window holds three 1,000 s lines on one slot: the first three run
and end inside the window, the others never start and end ``batch_expired``,
and the batch ends ``expired`` with the three answers in its output file.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from tests.batches.helpers import chat_line, jsonl
from tests.batches.virtual import content, submit, until_ended, yard
from tests.jobs.harness import EPOCH
from yard.core import SchedulerConfig
from yard.testing.upstream import Answer, FakeUpstream

SERVICE_S = 1000.0


async def test_lines_that_cannot_finish_inside_the_window_expire_unstarted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    upstream = FakeUpstream(Answer(delay=SERVICE_S))
    async with yard(tmp_path, upstream) as batches:
        lines = [chat_line(f"r{i}") for i in range(6)]
        batch = await submit(batches, jsonl(lines), window="1h")
        done = await until_ended(batches, batch.id)
        output = await content(batches, done.output_file_id)
        errors = await content(batches, done.error_file_id)
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
    # The first line was on schedule (6 x 10 s left): below the app's default
    # priority. Once measured, 5 x 1,000 s need more than the window has left:
    # the lines run at the default.
    assert first.priority == 40.0
    assert by_id[output[1]["response"]["request_id"]].priority == 50.0
