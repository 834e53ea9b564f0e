"""The test backend: a real process that holds real memory and fails on demand."""

from __future__ import annotations

import base64
import io
import json
import struct
import subprocess
import sys
import wave
import zlib
from pathlib import Path

import httpx
import psutil
import pytest
import trio

from yard.testing.backend import backend_command
from yard.testing.fake import touch
from yard.testing.payloads import png_bytes, wav_bytes
from yard.testing.process import running_backend

MiB = 2**20


def decode_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, raw scanlines), checking signature and every CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        chunks[kind] = body
        pos += 12 + length
    assert set(chunks) == {b"IHDR", b"IDAT", b"IEND"}
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) == (8, 2)
    return width, height, zlib.decompress(chunks[b"IDAT"])


def test_png_is_valid_and_has_every_pixel() -> None:
    width, height, raw = decode_png(png_bytes(7, 3, b"seed"))
    assert (width, height) == (7, 3)
    assert len(raw) == 3 * (1 + 7 * 3)


def test_wav_is_readable_by_the_wave_module() -> None:
    with wave.open(io.BytesIO(wav_bytes(seconds=0.5, rate=8000))) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 8000)
        assert w.getnframes() == 4000


def test_touch_writes_every_page() -> None:
    buf = touch(3 * 4096 + 1)
    assert len(buf) == 3 * 4096 + 1
    assert buf[0] == buf[4096] == buf[3 * 4096] == 1


def test_backend_command_turns_keywords_into_switches() -> None:
    assert backend_command(
        port=5, python="py", load_time=0.5, oom=True, hang=False, model=["a", "b"], crash_after=None
    ) == [
        "py", "-m", "yard.testing.backend", "--port", "5",
        "--load-time", "0.5", "--oom", "--model", "a", "--model", "b",
    ]  # fmt: skip
    assert backend_command()[3:5] == ["--port", "{port}"]


@pytest.mark.slow
async def test_health_is_503_while_loading_then_200() -> None:
    with trio.fail_after(20):
        async with (
            running_backend(wait_ready=False, load_time=1.0) as backend,
            httpx.AsyncClient(base_url=backend.base_url) as client,
        ):
            loading = await client.get("/health")
            assert loading.status_code == 503
            assert loading.json()["error"]["message"] == "Loading model"
            t0 = trio.current_time()
            await backend.wait_ready()
            assert trio.current_time() - t0 > 0.3
            assert (await client.get("/health")).status_code == 200


@pytest.mark.slow
async def test_slow_start_delays_even_the_listening_socket() -> None:
    with trio.fail_after(20):
        t0 = trio.current_time()
        async with running_backend(wait_ready=False, slow_start=0.6) as backend:
            assert trio.current_time() - t0 >= 0.6
            assert backend.stdout_lines[-1].startswith("listening on http://127.0.0.1:")


@pytest.mark.slow
async def test_memory_is_really_held_and_grows_after_the_first_request(tmp_path: Path) -> None:
    counter = tmp_path / "served"
    with trio.fail_after(30):
        async with running_backend(
            memory="96MiB", grow_after_first="64MiB", counter_file=counter, model=["m1", "m2"]
        ) as backend:
            proc = psutil.Process(backend.pid)
            assert proc.memory_info().rss >= 96 * MiB
            async with httpx.AsyncClient(base_url=backend.base_url) as client:
                models = (await client.get("/v1/models")).json()
                assert [m["id"] for m in models["data"]] == ["m1", "m2"]
                chat = await client.post(
                    "/v1/chat/completions",
                    json={"model": "m2", "messages": [{"role": "user", "content": "hello"}]},
                    headers={"X-Yard-Request-Id": "r-1"},
                )
                assert chat.json()["choices"][0]["message"]["content"] == "echo: hello"
                assert chat.json()["model"] == "m2"
                assert proc.memory_info().rss >= (96 + 64) * MiB
                emb = (await client.post("/v1/embeddings", json={"input": ["a", "b"]})).json()
                assert [len(d["embedding"]) for d in emb["data"]] == [8, 8]
                image = (
                    await client.post("/v1/images/generations", json={"size": "16x8", "n": 2})
                ).json()
                assert len(image["data"]) == 2
                assert decode_png(base64.b64decode(image["data"][0]["b64_json"]))[:2] == (16, 8)
                speech = await client.post("/v1/audio/speech", json={"input": "hi"})
                assert speech.headers["content-type"] == "audio/wav"
                with wave.open(io.BytesIO(speech.content)) as w:
                    assert w.getnframes() > 0
                echo = await client.put("/anything/here?x=1", content=b"raw body")
                assert echo.json()["method"] == "PUT"
                assert echo.json()["path"] == "/anything/here"
                assert echo.json()["query"] == {"x": ["1"]}
                assert echo.json()["body"] == "raw body"
    # Health checks and /v1/models are not counted; the five API requests are.
    assert counter.read_text().splitlines() == ["r-1", "req-2", "req-3", "req-4", "req-5"]


@pytest.mark.slow
async def test_stream_sends_chunks_at_the_interval() -> None:
    interval = 0.2
    with trio.fail_after(20):
        async with (
            running_backend(chunks=4, chunk_interval=interval) as backend,
            httpx.AsyncClient(base_url=backend.base_url) as client,
        ):
            arrivals: list[float] = []
            events: list[str] = []
            body = {"stream": True, "messages": [{"role": "user", "content": "x"}]}
            start = trio.current_time()
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.headers["content-type"] == "text/event-stream"
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        arrivals.append(trio.current_time() - start)
                        events.append(line.removeprefix("data: "))
    assert events[-1] == "[DONE]"
    pieces = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert pieces == ["tok0 ", "tok1 ", "tok2 ", "tok3 ", None]
    # Chunk i cannot come before i intervals have passed...
    assert all(arrivals[i] >= i * interval for i in range(4)), arrivals
    # ...and the first was not held back until the end (no buffering). Only a
    # client stalled for two whole intervals could break this on a busy machine.
    assert arrivals[3] - arrivals[0] > interval, arrivals


@pytest.mark.slow
async def test_crash_after_serves_n_then_dies_mid_request(tmp_path: Path) -> None:
    counter = tmp_path / "served"
    with trio.fail_after(20):
        async with (
            running_backend(crash_after=2, counter_file=counter) as backend,
            httpx.AsyncClient(base_url=backend.base_url) as client,
        ):
            for _ in range(2):
                ok = await client.post("/v1/completions", json={"prompt": "p"})
                assert ok.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post("/v1/completions", json={"prompt": "p"})
            assert await backend.process.wait() == 3
    assert len(counter.read_text().splitlines()) == 2


@pytest.mark.slow
async def test_oom_prints_the_cuda_message_and_exits() -> None:
    with trio.fail_after(20):
        result = await trio.run_process(
            backend_command(port=0, oom=True, load_time=0.1),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1
    assert b"CUDA error: out of memory" in result.stderr
    assert b"ready" not in result.stdout


@pytest.mark.slow
async def test_hang_keeps_health_alive_but_never_answers() -> None:
    with trio.fail_after(20):
        async with (
            running_backend(hang=True) as backend,
            httpx.AsyncClient(base_url=backend.base_url) as client,
        ):
            with trio.move_on_after(0.5) as scope:
                await client.post("/v1/completions", json={"prompt": "p"})
            assert scope.cancelled_caught
            assert (await client.get("/health")).status_code == 200


@pytest.mark.slow
async def test_garbage_is_not_http_and_failing_health_is_500() -> None:
    with trio.fail_after(20):
        async with (
            running_backend(garbage=True, fail_health=True, wait_ready=False) as backend,
            httpx.AsyncClient(base_url=backend.base_url) as client,
        ):
            await trio.sleep(0.2)
            assert (await client.get("/health")).status_code == 500
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post("/v1/completions", json={"prompt": "p"})


def test_module_runs_as_a_script_with_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "yard.testing.backend", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--crash-after" in out.stdout
    assert "RuntimeWarning" not in out.stderr
