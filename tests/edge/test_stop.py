"""Stopping yard leaves nothing behind, however it is stopped."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.edge.harness import echo_toml, post, start_yard

pytestmark = pytest.mark.slow

CHAT = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'


def test_sigterm_twice_leaves_no_backend_behind(tmp_path: Path) -> None:
    yard = start_yard(tmp_path, echo_toml())
    try:
        assert post(yard, "/v1/chat/completions", CHAT).status == 200
        yard.note_children()
        assert yard.started, "the backend should be running"
        yard.proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        yard.proc.send_signal(signal.SIGTERM)
        # (Left running, yard.stop kills it and still counts what it left.)
        with contextlib.suppress(subprocess.TimeoutExpired):
            yard.proc.wait(timeout=30)
    finally:
        yard.stop()
