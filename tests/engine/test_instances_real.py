"""Several instances of one backend, end to end: ``yard serve`` with real test-backend
processes on loopback. Slow: it starts processes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from tests.gateway.conftest import backend_toml, running_yard

pytestmark = pytest.mark.slow

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


async def test_a_busy_first_instance_sends_the_next_request_to_a_second_on_its_own_port(
    tmp_path: Path,
) -> None:
    # Each request holds the one slot for 3 s (the first measures it); a load
    # takes about 0.3 s plus the interpreter's start: waiting for the first
    # instance is slower than loading a second.
    body = backend_toml("llm", models=("tiny",), switches={"load_time": 0.3, "service_time": 3.0})
    body += "instances = 2\n"
    with trio.fail_after(60):
        async with running_yard(tmp_path, body) as runtime:
            assert runtime.parts.launcher is not None
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client:
                models = (await client.get("/v1/models")).json()["data"]
                assert [(m["id"], m["backend"], m["instances"]) for m in models] == [
                    ("tiny", "llm", ["llm", "llm@2"])
                ]
                # The first load measures the profile both instances share.
                first = await client.post("/v1/chat/completions", json=CHAT)
                assert first.status_code == 200
                answers: list[httpx.Response] = []

                async def ask() -> None:
                    answers.append(await client.post("/v1/chat/completions", json=CHAT))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(ask)
                    await trio.sleep(0.5)  # the first is being served
                    nursery.start_soon(ask)
                assert [a.status_code for a in answers] == [200, 200]
                pids = {a.headers["x-test-backend-pid"] for a in answers}
                assert len(pids) == 2, "two processes served them"
                running = runtime.parts.launcher.running()
                assert sorted(running) == ["llm", "llm@2"]
                assert running["llm"].port != running["llm@2"].port
                assert running["llm"].pid != running["llm@2"].pid
                metrics = (await client.get("/metrics")).text
                models = (await client.get("/v1/models")).json()["data"]
            assert [m["id"] for m in models] == ["tiny"]
            assert models[0]["state"] == "ready"
            for name in ("llm", "llm@2"):
                assert f'yard_backend_state{{backend="{name}",state="ready"}} 1' in metrics
            status = {b.name: b for b in runtime.parts.engine.snapshot().backends}
            assert status["llm"].state == status["llm@2"].state == "ready"
            bound = [
                d.decision.reason
                for d in runtime.parts.engine.decisions()
                if getattr(d.decision, "backend", None) == "llm@2"
                and "bound to" in d.decision.reason
            ]
            assert len(bound) == 1
            assert "llm ready, 1 of 1 slots busy" in bound[0]
