"""A batch larger than what the driver holds at once (issue 24: starting a
50,000-line batch held the event loop), on virtual time (see
:mod:`tests.batches.virtual`)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.batches.helpers import chat_line, jsonl
from tests.batches.virtual import content, submit, until_ended, yard
from tests.gateway.conftest import wait_until
from yard.batches import driver, validate, views
from yard.batches.records import LineRecord
from yard.batches.validate import check_input
from yard.testing.upstream import Answer, FakeUpstream


class _CallsPerStep(trio.abc.Instrument):
    """The most calls of a wrapped function made in one task step."""

    def __init__(self) -> None:
        self.now = self.most = self.total = 0

    def wrap(
        self, fn: Callable[[LineRecord, str, str], str]
    ) -> Callable[[LineRecord, str, str], str]:
        def counted(line: LineRecord, code: str, message: str) -> str:
            self.now += 1
            self.total += 1
            return fn(line, code, message)

        return counted

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.now = 0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.most = max(self.most, self.now)


async def test_a_cancelled_big_batch_ends_its_waiting_lines_a_page_per_loop_step(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1,500 lines: the first runs (100 s; until a run is measured no other
    # line is handed in), the rest are on disk when the batch is cancelled
    # and end batch_cancelled without becoming jobs. The driver made 1,000
    # of those outcomes per loop step (one transaction's worth); now a page.
    per_step = _CallsPerStep()
    monkeypatch.setattr(driver, "error_line", per_step.wrap(views.error_line))
    upstream = FakeUpstream(Answer(delay=100.0))
    async with yard(tmp_path, upstream) as batches:
        batch = await submit(batches, jsonl([chat_line(f"r{i}") for i in range(1500)]))
        await wait_until(lambda: bool(upstream.calls), poll_s=1)
        trio.lowlevel.add_instrument(per_step)
        await batches.cancel(batch.id, app="alice")
        done = await until_ended(batches, batch.id)
        trio.lowlevel.remove_instrument(per_step)
        errors = await content(batches, done.error_file_id)
    assert done.status == "cancelled"
    assert (done.total, done.completed, done.failed) == (1500, 1, 1499)
    assert [e["custom_id"] for e in errors] == [f"r{i}" for i in range(1, 1500)]
    assert per_step.total == 1499
    assert per_step.most <= 250  # a page


async def test_a_batch_longer_than_a_page_runs_each_line_once_in_order_across_a_crash(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver, "_PAGE", 3)
    upstream = FakeUpstream(Answer(delay=10.0))
    lines = [chat_line(f"r{i}", model="tiny" if i % 2 else "small") for i in range(11)]
    async with yard(tmp_path, upstream) as batches:
        batch = await submit(batches, jsonl(lines))
        await wait_until(lambda: len(upstream.calls) >= 5, poll_s=1)
    # Cut with lines done, one running, some queued as jobs and the rest on
    # disk, over several pages; the next start goes on from there.
    async with yard(tmp_path, upstream) as batches:
        done = await until_ended(batches, batch.id)
        output = await content(batches, done.output_file_id)
        errors = await content(batches, done.error_file_id)
        jobs, _ = await batches.jobs.list_jobs(app=None, limit=100)
    assert (done.status, done.completed, done.failed) == ("completed", 10, 1)
    assert [e["error"]["code"] for e in errors] == ["interrupted"]
    ended = sorted((line["custom_id"] for line in output + errors), key=lambda c: int(c[1:]))
    assert ended == [f"r{i}" for i in range(11)]
    # Each line became a job once, in submission order across the pages and
    # the restart (grouped by model in the order models first appear), and
    # reached the backend once.
    assert [job.id.rsplit("_", 1)[1] for job in reversed(jobs)] == [str(i) for i in range(11)]
    served = [dict(call.request.headers)[b"x-yard-request-id"] for call in upstream.calls]
    assert len(served) == len(set(served)) == 11


def test_a_checked_files_lines_leave_the_garbage_collectors_sight() -> None:
    # 50,000 line records alive at once made the collector scan the whole
    # heap, holding the GIL (and so the event loop) 50-250 ms each time.
    text = jsonl([chat_line(f"r{i}") for i in range(100)])
    checked = check_input(
        text, endpoint="/v1/chat/completions", route=lambda m: "llm", max_lines=100
    )
    assert len(checked.lines) == 100 and checked.lines[7].custom_id == "r7"
    gc.collect()
    assert not any(gc.is_tracked(row) for row in checked.lines.rows)


async def test_a_big_input_file_is_checked_in_a_worker_while_the_loop_keeps_serving(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every file is checked in a worker thread here, a piece of 1 KiB at a
    # time, and its lines are freed 100 at a time; the loop's turns are
    # counted while the check runs.
    monkeypatch.setattr(driver, "_INLINE_CHECK_BYTES", 0)
    monkeypatch.setattr(validate, "SPLIT_BYTES", 1024)
    monkeypatch.setattr(driver, "_FREE_CHUNK", 100)
    turns = 0
    during: list[int] = []
    checking = trio.Event()
    checked = False

    def counted_check(*args: Any, **kwargs: Any) -> validate.Checked:
        trio.from_thread.run_sync(checking.set)
        during.append(turns)
        result = validate.check_input(*args, **kwargs)
        # A check this small can end within one switch of the GIL, before the
        # loop had a turn (it failed so on a loaded machine). Still in the worker,
        # wait for the loop to turn: a check that held the loop would never see it.
        give_up = time.monotonic() + 30.0
        while turns == during[0] and time.monotonic() < give_up:
            time.sleep(0.001)
        during.append(turns)
        return result

    monkeypatch.setattr(driver, "check_input", counted_check)

    async def serve_meanwhile() -> None:
        nonlocal turns
        await checking.wait()
        while not checked:  # no other task sleeps meanwhile: the clock stays
            turns += 1
            await trio.lowlevel.checkpoint()

    upstream = FakeUpstream(Answer(delay=1.0))
    async with yard(tmp_path, upstream) as batches, trio.open_nursery() as nursery:
        nursery.start_soon(serve_meanwhile)
        batch = await submit(batches, jsonl([chat_line(f"r{i}") for i in range(60)]))
        while (await batches.get(batch.id, app=None)).status == "validating":
            await trio.lowlevel.checkpoint()
        checked = True
        done = await until_ended(batches, batch.id)
    assert (done.status, done.completed) == ("completed", 60)
    assert len(during) == 2 and during[1] - during[0] > 0
