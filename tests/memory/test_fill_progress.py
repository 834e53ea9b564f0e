"""The context fill's progress: llama-server's prompt_progress, read while it fills."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from yard.demo.llama_server import find_llama_server
from yard.demo.tinymodel import write_sized_llama
from yard.memory.warmup import FillProgress, _progress, fill_llama_context
from yard.supervisor.launcher import free_port


def test_a_progress_event_is_read_and_described() -> None:
    event = {"prompt_progress": {"total": 8192, "cache": 0, "processed": 3277, "time_ms": 51234}}
    progress = _progress("data: " + json.dumps(event))
    assert progress == FillProgress(processed=3277, total=8192, elapsed_s=51.234)
    assert progress.describe() == "warm-up 40 % (3,277 of 8,192 tokens, 51 s)"


def test_lines_without_progress_are_passed_over() -> None:
    assert _progress('data: {"content": "hi", "stop": false}') is None
    assert _progress("data: [DONE]") is None
    assert _progress(": ping") is None
    assert _progress("") is None


@pytest.mark.slow
@pytest.mark.skipif(find_llama_server() is None, reason="llama-server is not installed")
async def test_a_real_llama_server_reports_the_fill_until_it_is_whole(tmp_path: Path) -> None:
    model = write_sized_llama(tmp_path / "m.gguf", size_mb=5, n_layers=2, context_length=8192)
    argv = [sys.executable, "-m", "yard.demo.llama_server", "--host", "127.0.0.1"]
    port = free_port()
    argv += ["--port", str(port), "--model", str(model.path), "-c", "4096", "-np", "1"]
    argv += ["-b", "1024", "--threads", "2"]
    server = await trio.lowlevel.open_process(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base_url = f"http://127.0.0.1:{port}"
    seen: list[FillProgress] = []
    try:
        with trio.fail_after(120):
            async with httpx.AsyncClient(base_url=base_url, trust_env=False) as client:
                while True:
                    try:
                        if (await client.get("/health")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    await trio.sleep(0.2)
            await fill_llama_context(base_url, seen.append)
    finally:
        server.terminate()
        with trio.move_on_after(10):
            await server.wait()
        server.kill()
    # -b 1024: a report before each batch of 1024 tokens and one at the end.
    assert len(seen) >= 4
    assert [p.processed for p in seen] == sorted(p.processed for p in seen)
    assert seen[-1].percent == 100 and seen[-1].total == 4096 - 8
