"""yard end to end: ``yard serve``'s nursery, real test-backend processes,
real sockets (loopback). Slow: each test starts processes."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import trio

from tests.gateway.conftest import (
    backend_toml,
    free_port,
    running_yard,
    wait_healthy,
    wait_until,
    write_config,
)
from yard.app.serve import Running, serve
from yard.config import load_config
from yard.core.spec import Profile
from yard.memory import default_meter
from yard.memory.profiles import open_profile_store

pytestmark = pytest.mark.slow

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def _llm(tmp_path: Path, **switches: object) -> str:
    return backend_toml("llm", models=("tiny",), switches=switches)


def _engine_stats(runtime: Running) -> object:
    return runtime.parts.engine.statistics()


async def test_openai_client_gets_the_same_answers_through_yard_as_directly(
    tmp_path: Path,
) -> None:
    body = _llm(tmp_path, chunks=4, chunk_interval=0.01) + backend_toml("echo", api="plain")
    with trio.fail_after(60):
        async with running_yard(tmp_path, body) as runtime:
            url = runtime.urls[0]

            def talk(base_url: str) -> tuple[str, list[str]]:
                client = openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0)
                with client:
                    answer = client.chat.completions.create(
                        model="tiny", messages=[{"role": "user", "content": "hello"}]
                    )
                    stream = client.chat.completions.create(
                        model="tiny", messages=[{"role": "user", "content": "hello"}], stream=True
                    )
                    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
                return answer.choices[0].message.content or "", pieces

            via_yard = await trio.to_thread.run_sync(talk, url)
            assert runtime.parts.launcher is not None
            direct_url = runtime.parts.launcher.running()["llm"].base_url
            direct = await trio.to_thread.run_sync(talk, direct_url)
            assert via_yard == direct
            assert via_yard[1][:4] == ["tok0 ", "tok1 ", "tok2 ", "tok3 "]

            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                models = await client.get("/v1/models")
                plain = await client.post("/backends/echo/render?x=1", content=b"\x00raw")
            echo = plain.json()
            assert (echo["method"], echo["path"], echo["body"]) == ("POST", "/render", "\x00raw")
            assert echo["query"] == {"x": ["1"]}
            sent = dict(echo["headers"])
            assert plain.headers["x-yard-request-id"] == sent["x-yard-request-id"]
            assert [(m["id"], m["state"]) for m in models.json()["data"]] == [("tiny", "ready")]


async def test_backend_crash_mid_request_fails_the_client_and_is_never_retried(
    tmp_path: Path,
) -> None:
    counter = tmp_path / "served.txt"
    body = _llm(tmp_path, crash_after=1, counter_file=str(counter))
    with trio.fail_after(60):
        async with running_yard(tmp_path, body) as runtime:
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client:
                ok = await client.post("/v1/chat/completions", json=CHAT)
                crashed = await client.post("/v1/chat/completions", json=CHAT)
                again = await client.post("/v1/chat/completions", json=CHAT)
            assert ok.status_code == 200
            assert crashed.status_code == 502
            assert crashed.json()["error"]["code"] == "backend_failed"
            # The next request starts the backend again: a new process.
            assert again.status_code == 200
            assert again.headers["x-test-backend-pid"] != ok.headers["x-test-backend-pid"]
            served = counter.read_text().split()
            assert served == [ok.headers["x-yard-request-id"], again.headers["x-yard-request-id"]]
            stats = runtime.parts.engine.statistics()
            assert stats.requeues == 0
            assert stats.loads == 2


async def test_model_that_cannot_fit_is_refused_at_once(tmp_path: Path) -> None:
    body = _llm(tmp_path)
    config = load_config(write_config(tmp_path, body))
    meter = default_meter()
    store = await open_profile_store(config, devices=meter.describe())
    await store.put("llm", Profile(gpu_bytes=0, host_bytes=2**62, load_s=1.0))
    await store.aclose()
    meter.close()
    with trio.fail_after(60):
        async with running_yard(tmp_path, body) as runtime:
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client:
                start = trio.current_time()
                response = await client.post("/v1/chat/completions", json=CHAT)
                took = trio.current_time() - start
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "does_not_fit"
            assert took < 2.0
            assert runtime.parts.engine.statistics().loads == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_yard_killed_with_sigkill_leaves_no_orphan_once_started_again(
    tmp_path: Path,
) -> None:
    port = free_port()
    config = write_config(tmp_path, _llm(tmp_path), listen=f"127.0.0.1:{port}")
    argv = [sys.executable, "-m", "yard.cli", "serve", "--config", str(config)]
    first = await trio.lowlevel.open_process(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    second: trio.Process | None = None
    backend_pid = 0
    try:
        with trio.fail_after(60):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                await wait_healthy(client)
                response = await client.post("/v1/chat/completions", json=CHAT)
                assert response.status_code == 200
                backend_pid = int(response.headers["x-test-backend-pid"])
                first.kill()
                await first.wait()
                assert _alive(backend_pid), "the backend should outlive a SIGKILLed yard"
                second = await trio.lowlevel.open_process(
                    argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                await wait_healthy(client)
                # Orphans are reaped before yard serves.
                await wait_until(lambda: not _alive(backend_pid))
                again = await client.post("/v1/chat/completions", json=CHAT)
                assert again.status_code == 200
                assert int(again.headers["x-test-backend-pid"]) != backend_pid
    finally:
        with trio.CancelScope(shield=True):
            for proc in (first, second):
                if proc is not None and proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                    with trio.move_on_after(20):
                        await proc.wait()
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()
        if backend_pid and _alive(backend_pid):
            os.kill(backend_pid, signal.SIGKILL)


async def test_respond_async_becomes_a_job_whose_result_is_the_backend_answer(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_yard(tmp_path, _llm(tmp_path)) as runtime:
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client:
                accepted = await client.post(
                    "/v1/chat/completions", json=CHAT, headers={"prefer": "respond-async"}
                )
                assert accepted.status_code == 202
                location = accepted.headers["location"]
                assert location == f"/v1/jobs/{accepted.json()['id']}"
                result = await client.get(location + "/result", params={"wait": "30"})
            assert result.status_code == 200
            assert result.json()["choices"][0]["message"]["content"] == "echo: hi"
            assert runtime.parts.engine.statistics().requests.get("ok") == 1


async def test_sigterm_lets_the_stream_in_flight_finish_then_stops_the_backends(
    tmp_path: Path,
) -> None:
    config = load_config(write_config(tmp_path, _llm(tmp_path, chunks=8, chunk_interval=0.1)))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            runtime: Running = await nursery.start(serve, config)
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client:
                body = {**CHAT, "stream": True}
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    pid = int(response.headers["x-test-backend-pid"])
                    os.kill(os.getpid(), signal.SIGTERM)
                    text = (await response.aread()).decode()
            # Everything the backend sent arrived, to the end.
            assert text.count("data: ") == 10
            assert text.rstrip().endswith("data: [DONE]")
        # serve returned by itself: the backend process is gone.
        assert not _alive(pid)


async def test_a_second_yard_on_a_taken_port_fails_before_touching_the_backends(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_yard(tmp_path, _llm(tmp_path)) as runtime:
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client:
                first = await client.post("/v1/chat/completions", json=CHAT)
                listen = runtime.urls[0].removeprefix("http://")
                second = await trio.run_process(
                    [
                        sys.executable,
                        "-m",
                        "yard.cli",
                        "serve",
                        "--config",
                        str(runtime.parts.config.path),
                        "--listen",
                        listen,
                    ],
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
                after = await client.post("/v1/chat/completions", json=CHAT)
            assert second.returncode == 1
            assert b"cannot listen on" in second.stderr
            # Same backend process: the second yard reaped nothing.
            assert after.headers["x-test-backend-pid"] == first.headers["x-test-backend-pid"]


def _requests_total(metrics: str, model: str, backend: str, outcome: str) -> float:
    wanted = f'yard_requests_total{{backend="{backend}",model="{model}",outcome="{outcome}"}} '
    for line in metrics.splitlines():
        if line.startswith(wanted):
            return float(line.removeprefix(wanted))
    return 0.0


async def test_metrics_count_each_proxied_request_by_model_and_outcome(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_yard(tmp_path, _llm(tmp_path)) as runtime:
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client:
                before = (await client.get("/metrics")).text
                assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
                assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
                after = (await client.get("/metrics")).text
            ok = ("tiny", "llm", "ok")
            assert _requests_total(after, *ok) == _requests_total(before, *ok) + 2


async def test_metrics_show_the_http_servers_connections(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with (
            running_yard(tmp_path, _llm(tmp_path)) as runtime,
            httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client,
        ):
            metrics = (await client.get("/metrics")).text
    values = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("yard_http_")
    }
    assert values['yard_http_connections{state="open"}'] >= 1  # this scrape's own
    assert values["yard_http_max_connections"] > 0
    assert values['yard_http_connections_closed_total{reason="evicted"}'] == 0


async def test_forgetting_a_profile_through_the_admin_api_drops_the_stored_one(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_yard(tmp_path, _llm(tmp_path)) as runtime:
            store = runtime.parts.profiles
            assert store is not None
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client:
                assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
                # The first load was measured; its profile is stored once ready.
                while True:
                    if await store.get("llm") is not None:
                        break
                    await trio.sleep(0.05)
                forgotten = await client.delete("/admin/profiles/llm")
            assert forgotten.json() == {"backend": "llm", "forgotten": True, "store": True}
            assert await store.get("llm") is None


async def test_sigterm_ends_an_open_log_tail_cleanly_before_the_grace_runs_out(
    tmp_path: Path,
) -> None:
    # stop_grace_s is 2: a stream still open then would be cut.
    config = load_config(write_config(tmp_path, _llm(tmp_path)))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            runtime: Running = await nursery.start(serve, config)
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client:
                assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
                async with client.stream("GET", "/admin/backends/llm/log") as tail:
                    assert tail.status_code == 200
                    chunks = tail.aiter_bytes()
                    assert (await chunks.__anext__()).startswith(b": yard log tail")
                    os.kill(os.getpid(), signal.SIGTERM)
                    signalled = trio.current_time()
                    # Read to the end: a stream cut by the grace would raise.
                    async for _ in chunks:
                        pass
                    ended_after = trio.current_time() - signalled
    assert ended_after < 1.0


async def test_jobs_settings_in_the_config_reach_the_job_service(tmp_path: Path) -> None:
    body = _llm(tmp_path) + "\n[jobs]\nmax_result_bytes = 16\n"
    with trio.fail_after(60):
        async with running_yard(tmp_path, body) as runtime:
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client:
                accepted = await client.post(
                    "/v1/chat/completions", json=CHAT, headers={"prefer": "respond-async"}
                )
                assert accepted.status_code == 202
                job = await client.get(accepted.headers["location"], params={"wait": "30"})
            assert job.json()["status"] == "failed"
            assert job.json()["error"]["code"] == "result_too_large"


async def test_serve_logs_backend_starts_readiness_and_rejections_with_reasons(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(60), caplog.at_level(logging.INFO, logger="yard"):
        async with running_yard(tmp_path, _llm(tmp_path, service_time=1.0)) as runtime:
            engine = runtime.parts.engine
            async with httpx.AsyncClient(base_url=runtime.urls[0], timeout=30) as client:
                await client.post("/v1/chat/completions", json=CHAT)

                async def busy() -> None:
                    await client.post("/v1/chat/completions", json=CHAT)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(busy)
                    await wait_until(lambda: engine.statistics().inflight == 1)
                    refused = await client.post(
                        "/v1/chat/completions", json=CHAT, headers={"x-yard-start-within": "0.2"}
                    )
                unload = await client.post("/admin/backends/llm/unload")
                supervisor = runtime.parts.launcher
                assert supervisor is not None
                await wait_until(lambda: not supervisor.running())
    assert unload.status_code == 202
    assert refused.status_code == 409
    request_id = refused.headers["x-yard-request-id"]
    lines = [r.getMessage() for r in caplog.records if r.name == "yard.serve"]
    assert any(line.startswith("starting llm: ") for line in lines)
    assert any(line.startswith("llm is ready (") for line in lines)
    assert any(
        line.startswith(f"rejected (409 deadline_infeasible) {request_id}: ") for line in lines
    )
    assert any(line.startswith("stopping llm: ") for line in lines)
    assert "llm stopped" in lines


async def test_the_start_up_log_says_who_may_use_yard(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    apps = '[apps.chat]\nkey = "key-chat"\n\n'
    with caplog.at_level(logging.INFO, logger="yard.serve"), trio.fail_after(60):
        async with running_yard(tmp_path, apps + _llm(tmp_path)):
            pass
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("access: ")]
    assert lines == [
        "access: data plane: an app key required (1 app(s))",
        "access: admin API: no key, from this machine only",
    ]
