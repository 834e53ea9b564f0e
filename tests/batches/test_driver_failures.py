"""Every batch ends: input the store cannot hold, answers too deep to read
and a driver that fails all end the batch, on virtual time (see
:mod:`tests.batches.virtual`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import trio
import trio.testing

from tests.batches.helpers import chat_line, jsonl
from tests.batches.virtual import content, submit, until_ended, yard
from yard.batches.records import LineRecord
from yard.testing.upstream import Answer, FakeUpstream


async def test_a_custom_id_with_a_lone_surrogate_fails_the_batch_naming_its_line(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # JSON may escape a lone surrogate; UTF-8 (and so the store) cannot hold it.
    lines = jsonl([chat_line("fine")]) + b'{"custom_id": "\\ud800", "method": "POST", '
    lines += b'"url": "/v1/chat/completions", "body": {"model": "tiny"}}\n'
    upstream = FakeUpstream(Answer(delay=1.0))
    async with yard(tmp_path, upstream) as batches:
        batch = await submit(batches, lines)
        with trio.fail_after(3600):
            done = await until_ended(batches, batch.id)
    assert done.status == "failed"
    assert [(e.code, e.line, e.param) for e in done.errors] == [("invalid_request", 2, "custom_id")]
    assert "UTF-8" in done.errors[0].message
    assert upstream.calls == []


async def test_an_answer_nested_too_deep_to_read_is_kept_as_text_and_the_batch_completes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    upstream = FakeUpstream(Answer(delay=1.0, chunks=[deep]))
    async with yard(tmp_path, upstream) as batches:
        batch = await submit(batches, jsonl([chat_line("a"), chat_line("b")]))
        with trio.fail_after(3600):
            done = await until_ended(batches, batch.id)
        output = await content(batches, done.output_file_id)
    assert (done.status, done.completed) == ("completed", 2)
    assert [line["custom_id"] for line in output] == ["a", "b"]
    assert output[0]["response"]["body"] == deep.decode()


async def test_a_driver_that_fails_ends_its_batch_failed_with_the_reason(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The disk refuses the first line's outcome, as SQLite does when it fails.
    upstream = FakeUpstream(Answer(delay=10.0))
    async with yard(tmp_path, upstream) as batches:
        record = batches.store.record

        async def broken(line: LineRecord, *, outcome: str, output: str) -> bool:
            if line.custom_id == "r1":
                raise sqlite3.OperationalError("disk I/O error")
            return await record(line, outcome=outcome, output=output)

        batches.store.record = broken  # type: ignore[method-assign]
        batch = await submit(batches, jsonl([chat_line(f"r{i}") for i in range(4)]))
        with trio.fail_after(3600):
            done = await until_ended(batches, batch.id)
        output = await content(batches, done.output_file_id)
        jobs = [await batches.jobs.store.get(f"job_{batch.id[6:]}_{i}") for i in range(4)]
    assert done.status == "failed"
    assert done.failed_at is not None
    [error] = done.errors
    assert error.code == "batch_failed"
    assert "disk I/O error" in error.message
    # What had finished is kept; nothing is left queued to run for nobody.
    assert [line["custom_id"] for line in output] == ["r0"]
    assert done.completed == 1
    assert not any(job is not None and job.status == "queued" for job in jobs)
