"""A parallel range with a real yard and real test-backend processes: the
supervisor fills ``{parallel}`` with the core's choice (a first load gets the
maximum) and the instance serves that many requests at once, the next waits;
``/v1/models`` shows the slot count beside the context."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import psutil
import pytest
import trio

from tests.gateway.conftest import running_yard, wait_until
from yard.testing.backend import backend_command

pytestmark = pytest.mark.slow

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def body() -> str:
    argv = backend_command(service_time=1.5)
    return (
        "[backends.llm]\n"
        f"command = {json.dumps(argv)}\n"
        'models = ["tiny"]\n'
        'env = { SLOTS = "{parallel}", PER_SLOT = "{context}", TOTAL = "{total_context}" }\n'
        "context = { min = 512, max = 2048 }\n"
        "parallel = { min = 1, max = 3 }\n"
        "startup_timeout_s = 30\n"
    )


async def test_the_instance_gets_its_slot_count_and_serves_that_many_at_once(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_yard(tmp_path, body()) as runtime:
            url = runtime.urls[0]
            answers: list[int] = []

            async def ask(client: httpx.AsyncClient) -> None:
                answers.append((await client.post("/v1/chat/completions", json=CHAT)).status_code)

            async with (
                httpx.AsyncClient(base_url=url, timeout=30) as client,
                trio.open_nursery() as nursery,
            ):
                for _ in range(4):
                    nursery.start_soon(ask, client)

                def llm_busy() -> int:
                    views = runtime.parts.engine.snapshot().backends
                    return next(v.inflight for v in views if v.name == "llm")

                await wait_until(lambda: llm_busy() == 3)
                view = next(v for v in runtime.parts.engine.snapshot().backends if v.name == "llm")
                assert (view.context, view.parallel, view.slots) == (2048, 3, 3)
                assert runtime.parts.engine.statistics().queue_length == 1
                assert runtime.parts.launcher is not None
                pid = runtime.parts.launcher.running()["llm"].pid
                assert pid is not None
                env = psutil.Process(pid).environ()
                assert (env["SLOTS"], env["PER_SLOT"], env["TOTAL"]) == ("3", "2048", "6144")
                models = (await client.get("/v1/models")).json()["data"]
                assert [(m["context"], m["parallel"]) for m in models] == [(2048, 3)]
            assert answers == [200] * 4
