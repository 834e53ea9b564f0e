"""A batch across a crash, and grouping by model, on virtual time (see
:mod:`tests.batches.virtual`)."""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import trio
import trio.testing

from tests.batches.helpers import chat_line, jsonl
from tests.batches.virtual import content, submit, until_ended, yard
from tests.gateway.conftest import wait_until
from tests.jobs.harness import proxy_request
from yard.testing.ports import FakeLauncher, Script
from yard.testing.upstream import Answer, FakeUpstream


def _ids(upstream: FakeUpstream) -> list[str]:
    """The job id of each request that reached the backend, in order."""
    return [dict(call.request.headers)[b"x-yard-request-id"].decode() for call in upstream.calls]


async def _crash_while_the_first_line_runs(
    tmp_path: Path, upstream: FakeUpstream, *, rerun_safe: bool
) -> str:
    lines = [chat_line(f"r{i}") for i in range(4)]
    async with yard(tmp_path, upstream) as batches:
        batch = await submit(batches, jsonl(lines), rerun_safe=rerun_safe)
        await wait_until(lambda: bool(upstream.calls), poll_s=1)
        await trio.sleep(10)  # r0 is running (100 s); r1.. wait
        assert (await batches.get(batch.id, app=None)).status == "in_progress"
    return batch.id


async def test_a_batch_survives_a_crash_and_its_running_line_is_never_run_again(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    upstream = FakeUpstream(Answer(delay=100.0))
    batch_id = await _crash_while_the_first_line_runs(tmp_path, upstream, rerun_safe=False)
    async with yard(tmp_path, upstream) as batches:
        done = await until_ended(batches, batch_id)
        output = await content(batches, done.output_file_id)
        errors = await content(batches, done.error_file_id)
    assert done.status == "completed"
    assert (done.total, done.completed, done.failed) == (4, 3, 1)
    assert [e["custom_id"] for e in errors] == ["r0"]
    assert errors[0]["error"]["code"] == "interrupted"
    assert errors[0]["response"] is None
    assert [line["custom_id"] for line in output] == ["r1", "r2", "r3"]
    runs = collections.Counter(_ids(upstream))
    assert len(runs) == 4 and set(runs.values()) == {1}


async def test_a_rerun_safe_batch_runs_its_interrupted_line_once_more(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    upstream = FakeUpstream(Answer(delay=100.0))
    batch_id = await _crash_while_the_first_line_runs(tmp_path, upstream, rerun_safe=True)
    async with yard(tmp_path, upstream) as batches:
        done = await until_ended(batches, batch_id)
        output = await content(batches, done.output_file_id)
    assert done.status == "completed"
    assert (done.completed, done.failed) == (4, 0)
    assert [line["custom_id"] for line in output] == ["r0", "r1", "r2", "r3"]
    runs = collections.Counter(_ids(upstream))
    assert sorted(runs.values()) == [1, 1, 1, 2]
    first = _ids(upstream)[0]
    assert runs[first] == 2


async def test_a_batch_cut_while_validating_is_validated_again(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    upstream = FakeUpstream(Answer(delay=1.0))
    async with yard(tmp_path, upstream) as batches:
        # Stored as create() stores it, but yard dies before its driver starts.
        source = await batches.upload(
            app="alice", purpose="batch", filename="x", content=jsonl([chat_line("a")])
        )
        batch = await batches.store.add_batch(
            batch_id="batch_cut",
            app="alice",
            endpoint="/v1/chat/completions",
            input_file_id=source.id,
            completion_window="24h",
            metadata=None,
            priority=50.0,
            rerun_safe=False,
            created_at=0.0,
            expires_at=2e9,
        )
        assert batch.status == "validating"
    async with yard(tmp_path, upstream) as batches:
        done = await until_ended(batches, "batch_cut")
    assert (done.status, done.completed) == ("completed", 1)


async def test_lines_are_handed_in_by_model_so_each_model_loads_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    launcher = FakeLauncher({"llm": Script(ready_after_s=5), "other": Script(ready_after_s=5)})
    upstream = FakeUpstream(Answer(delay=2.0))
    lines = [chat_line(f"r{i}", model="tiny" if i % 2 else "small") for i in range(10)]
    async with yard(tmp_path, upstream, launcher) as batches:
        batch = await submit(batches, jsonl(lines))
        done = await until_ended(batches, batch.id)
    assert (done.status, done.completed) == ("completed", 10)
    assert [name for _, name, _ in launcher.launched] == ["other", "llm"]
    served = [call.base_url for call in upstream.calls]
    assert served == sorted(served, key=served.index)  # one backend's lines, then the other's


async def test_the_apps_interactive_requests_go_ahead_of_its_batch_lines(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    upstream = FakeUpstream(Answer(delay=10.0))
    lines = [chat_line(f"r{i}") for i in range(5)]
    async with yard(tmp_path, upstream) as batches:
        batch = await submit(batches, jsonl(lines))
        # r1 runs (r0's run is measured, so r2-r4 wait in the queue); then an
        # interactive request of the same app, at its default priority.
        await wait_until(lambda: len(upstream.calls) >= 2, poll_s=1)
        interactive = dataclasses.replace(
            proxy_request(app="alice", priority=50.0, path="/v1/chat/completions"),
            backend="llm",
            model="tiny",
        )
        job = await batches.jobs.submit(interactive, rerun_safe=False)
        done = await until_ended(batches, batch.id)
    order = _ids(upstream)
    assert done.status == "completed"
    assert order[2] == job["id"]  # right after the line that was running
    assert len(order) == 6


async def test_cancelling_a_batch_while_it_is_validating_ends_it_with_no_lines(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    upstream = FakeUpstream(Answer(delay=1.0))
    async with yard(tmp_path, upstream) as batches:
        batch = await submit(batches, jsonl([chat_line("a")]))
        cancelled = await batches.cancel(batch.id, app="alice")
        done = await until_ended(batches, batch.id)
    assert cancelled.status == "cancelling"
    assert done.status == "cancelled"
    assert (done.total, done.completed, done.failed) == (0, 0, 0)
    assert upstream.calls == []


async def test_a_line_that_ends_while_the_service_time_is_read_wakes_the_feeder(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Answers are 500s, so no run is ever measured and each line waits for the
    # one before it; the service-time read is slow, so a line ends during it.
    upstream = FakeUpstream(Answer(delay=1.0, status=500))
    async with yard(tmp_path, upstream) as batches:
        read = batches.store.service_times

        async def slow_read(backend: str, *, limit: int = 20) -> list[float]:
            await trio.sleep(30)
            return await read(backend, limit=limit)

        batches.store.service_times = slow_read  # type: ignore[method-assign]
        batch = await submit(batches, jsonl([chat_line(f"r{i}") for i in range(3)]))
        with trio.fail_after(3600):
            done = await until_ended(batches, batch.id)
    assert (done.status, done.failed) == ("completed", 3)


async def test_a_finished_lines_job_reads_as_it_ended_and_points_at_its_batch(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The batch takes the line's result into its output file at once; the
    # job must not read "expired" (to an OpenAI user: it never ran in time).
    upstream = FakeUpstream(Answer(delay=1.0))
    async with yard(tmp_path, upstream) as batches:
        batch = await submit(batches, jsonl([chat_line("a")]))
        await until_ended(batches, batch.id)
        job = await batches.jobs.get(f"job_{batch.id.removeprefix('batch_')}_0", app=None)
        shown = batches.jobs.describe(job)
    assert (shown["status"], shown["result"]) == ("succeeded", None)
    assert shown["result_gone"] == (
        f"its answer is a line of batch {batch.id}'s output or error file "
        "(GET /v1/batches/ID, then its output_file_id)"
    )
