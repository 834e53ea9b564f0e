from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest
from rich.console import Console

from yard.cli import main
from yard.core.decisions import Dispatch, Requeue
from yard.observe import Observer
from yard.testing.engine import FakeEngine, profile, queued_view


def _printed(engine: FakeEngine) -> str:
    from yard.status import render

    console = Console(record=True, width=200, color_system=None)
    render(Observer(engine=engine, profile_margin=1.25).status(), console)
    return console.export_text()


async def test_status_shows_memory_backends_queue_and_profiles(engine: FakeEngine) -> None:
    engine.queue.append(queued_view("req-7", "tts", app="radio", reason="waiting for tts to load"))
    engine.decide(Dispatch(reason="llm is ready and idle", request_id="req-1", backend="llm"))
    text = _printed(engine)
    assert "gpu0" in text
    assert "16.0 GiB" in text  # free on gpu0
    assert "llm" in text and "ready" in text and "1/2" not in text
    assert "0/2" in text  # inflight / slots
    assert "waiting for tts to load" in text
    assert "radio" in text
    assert "llm is ready and idle" in text
    assert "Profiles (measured peaks)" in text
    assert "12s" in text  # load time
    assert "host-only mode" not in text


async def test_status_says_host_only_mode_and_shows_failure_logs() -> None:
    engine = FakeEngine()
    engine.set_backend("tts", state="ready", profile=profile(0, 0.5, 2.0), loaded_at=0.0)
    engine.decide(Dispatch(reason="tts idle", request_id="r1", backend="tts"))
    engine.decide(Requeue(reason="tts ran out of memory that yard over-committed", request_id="r1"))
    engine.logs["tts"] = ["loading voice", "CUDA error: out of memory"]
    text = _printed(engine)
    assert "host-only mode (no GPU found)" in text
    assert "tts ran out of memory that yard over-committed" in text
    assert "CUDA error: out of memory" in text


def test_status_explains_when_yard_is_not_running(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["status", "--url", f"http://127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach yard at http://127.0.0.1:{port}" in err
    assert "is `yard serve` running?" in err


def test_status_finds_yard_and_its_admin_key_in_the_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from yard.status import resolve_target

    monkeypatch.delenv("YARD_ADMIN_KEY", raising=False)
    config = tmp_path / "yard.toml"
    config.write_text(
        f'[server]\nlisten = "0.0.0.0:9123"\nadmin_key = "from-config"\nallow_anonymous = true\n'
        f'data_dir = "{tmp_path / "data"}"\n'
    )
    parsed = argparse.Namespace(url=None, key=None, config=config)
    assert resolve_target(parsed) == ("http://127.0.0.1:9123", "from-config")
    monkeypatch.setenv("YARD_ADMIN_KEY", "from-env")
    assert resolve_target(parsed) == ("http://127.0.0.1:9123", "from-env")
    explicit = argparse.Namespace(url="http://10.1.2.3:80/", key="given", config=config)
    assert resolve_target(explicit) == ("http://10.1.2.3:80", "given")
    bare = argparse.Namespace(url=None, key=None, config=None)
    assert resolve_target(bare) == ("http://127.0.0.1:8080", "from-env")


async def test_at_80_columns_reasons_read_as_lines_and_queued_ids_differ(
    engine: FakeEngine,
) -> None:
    # Two synchronous ids of one run share their first 12 characters.
    for n in (0xA1F, 0xB20):
        engine.queue.append(
            queued_view(
                f"c768734d7003{n:012x}",
                "tts",
                app="radio",
                reason="waiting for a free slot on tts (1/1 busy); next after 3 of higher priority",
            )
        )
    from yard.status import render

    console = Console(record=True, width=80, color_system=None)
    render(Observer(engine=engine, profile_margin=1.25).status(), console)
    text = console.export_text()
    assert "…000000000a1f" in text and "…000000000b20" in text
    # The reason is a line under the table, not a word per line in a thin column.
    assert "waiting for a free slot on tts (1/1 busy); next after 3 of higher" in text


def test_piped_status_is_written_wide_enough_not_to_wrap() -> None:
    from yard.status import PIPED_WIDTH, _console

    assert _console().width >= PIPED_WIDTH  # pytest's stdout is no terminal
