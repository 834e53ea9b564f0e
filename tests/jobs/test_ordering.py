"""Jobs and synchronous requests share one queue and one priority order: the
real ``yard serve`` (engine, core, gateway, job service) with a real test
backend that has one slot."""

from __future__ import annotations

import functools
from pathlib import Path

import httpx
import pytest
import trio

from tests.gateway.conftest import backend_toml, running_yard, wait_until
from yard.engine import Engine


def _queue_has(engine: Engine, n: int) -> bool:
    return engine.statistics().queue_length == n


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.slow
async def test_sync_requests_and_jobs_interleaved_are_served_in_one_priority_order(
    tmp_path: Path,
) -> None:
    counter = tmp_path / "served.txt"
    body = backend_toml(
        "llm", models=("tiny",), switches={"service_time": 1.0, "counter_file": str(counter)}
    )
    # (label, priority, as a job?) in the order they arrive.
    arrivals = [
        ("sync-10", 10, False),
        ("job-90", 90, True),
        ("sync-50", 50, False),
        ("job-30", 30, True),
        ("job-70", 70, True),
        ("sync-80", 80, False),
    ]
    with trio.fail_after(90):
        async with running_yard(tmp_path, body) as runtime:
            engine = runtime.parts.engine
            ids: dict[str, str] = {}
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=60) as client:

                async def send(label: str, priority: int, as_job: bool) -> None:
                    headers = {"x-yard-priority": str(priority)}
                    if as_job:
                        headers["prefer"] = "respond-async"
                    response = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
                    if as_job:
                        assert response.status_code == 202, response.text
                        ids[label] = response.json()["id"]
                    else:
                        assert response.status_code == 200, response.text
                        ids[label] = response.headers["x-yard-request-id"]

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(send, "first", 0, False)
                    await wait_until(lambda: engine.statistics().inflight == 1)
                    for n, (label, priority, as_job) in enumerate(arrivals, start=1):
                        nursery.start_soon(send, label, priority, as_job)
                        await wait_until(functools.partial(_queue_has, engine, n))
                jobs = [label for label, _, as_job in arrivals if as_job]
                for label in jobs:
                    job = await client.get(f"/v1/jobs/{ids[label]}?wait=30")
                    assert job.json()["status"] == "succeeded", job.text
    served = counter.read_text().split()
    by_id = {request_id: label for label, request_id in ids.items()}
    assert [by_id.get(s, s) for s in served] == [
        "first",
        "job-90",
        "sync-80",
        "job-70",
        "sync-50",
        "job-30",
        "sync-10",
    ]
