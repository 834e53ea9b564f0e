"""The demo, end to end: `yard serve` with config/demo.toml starts the real
llama-server, piper and the image stand-in on demand, and the official openai
client talks to them through yard as it would to the servers themselves."""

from __future__ import annotations

import base64
import shutil
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from openai import OpenAI

from tests.real.clients import assert_full_round, chat_and_completions
from tests.real.servers import (
    Server,
    free_port,
    llama_server_or_skip,
    piper_or_skip,
    running_server,
    yard_argv,
)
from tests.real.test_tts import assert_speech, speak
from yard.demo.tinymodel import write_sized_llama

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-notebook"  # an app key of config/demo.toml


def _demo_copy(tmp_path: Path) -> Path:
    """config/demo.toml in a scratch tree: its data dir (``../.data`` from the
    file) and the model `make demo-setup` would write land under tmp_path."""
    config = tmp_path / "config" / "demo.toml"
    config.parent.mkdir()
    shutil.copy(ROOT / "config" / "demo.toml", config)
    write_sized_llama(tmp_path / ".data" / "models" / "tiny-llama.gguf", size_mb=5)
    return config


def _image(base_url: str) -> bytes:
    with OpenAI(base_url=base_url + "/v1", api_key=KEY, max_retries=0, timeout=60) as client:
        result = client.images.generate(model="tiny-image", prompt="a yard at dusk")
    assert result.data is not None
    b64 = result.data[0].b64_json
    assert b64 is not None
    return base64.b64decode(b64)


async def _yard(tmp_path: Path) -> tuple[list[str], int]:
    port = free_port()
    return yard_argv(_demo_copy(tmp_path), port), port


async def test_openai_client_gets_chat_and_completions_through_yard(tmp_path: Path) -> None:
    llama_server_or_skip()
    argv, port = await _yard(tmp_path)
    with trio.fail_after(180):
        async with running_server(
            argv, port=port, log=tmp_path / "yard.log", health_path="/healthz"
        ) as yard:
            answers = await trio.to_thread.run_sync(
                partial(chat_and_completions, yard.base_url, model="tiny-llama", api_key=KEY)
            )
            headers = await _headers_of_a_chat(yard)
    assert_full_round(answers)
    assert set(answers.models) == {"tiny-llama", "tts-joe", "tiny-image"}
    assert headers.get("x-yard-request-id")
    assert float(headers["x-yard-queue-ms"]) >= 0


async def _headers_of_a_chat(yard: Server) -> httpx.Headers:
    async with httpx.AsyncClient(base_url=yard.base_url, timeout=60) as client:
        response = await client.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={
                "model": "tiny-llama",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            },
        )
    assert response.status_code == 200, response.text
    return response.headers


async def test_tts_and_images_answer_real_bytes_through_yard(tmp_path: Path) -> None:
    piper_or_skip()
    argv, port = await _yard(tmp_path)
    with trio.fail_after(180):
        async with running_server(
            argv, port=port, log=tmp_path / "yard.log", health_path="/healthz"
        ) as yard:
            speech = await trio.to_thread.run_sync(
                partial(speak, yard.base_url, "Platform two, on time.", api_key=KEY)
            )
            # The same server by name, on its own (piper's) API.
            async with httpx.AsyncClient(base_url=yard.base_url, timeout=90) as client:
                piper_api = await client.post(
                    "/backends/tts/synthesize",
                    headers={"Authorization": f"Bearer {KEY}"},
                    json={"text": "Platform two, the train is on time."},
                )
            png = await trio.to_thread.run_sync(_image, yard.base_url)
    assert_speech(speech, min_seconds=1.0)
    assert piper_api.status_code == 200, piper_api.text
    assert_speech(piper_api.content, min_seconds=1.0)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
