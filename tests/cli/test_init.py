"""``yard init``: a starter configuration that passes ``yard check`` unchanged."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from yard import cli
from yard.config import key_digest, load_config


def test_init_writes_a_file_that_passes_check_with_the_folder_and_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "chat.gguf").write_bytes(b"GGUF")
    target = tmp_path / "yard.toml"
    assert cli.main(["init", "--models", str(models), "--config", str(target)]) == 0
    told = capsys.readouterr().out
    key = re.search(r"^    (\S+)$", told, re.MULTILINE)
    assert key is not None
    assert target.stat().st_mode & 0o777 == 0o600
    assert cli.main(["check", "--config", str(target)]) == 0
    checked = capsys.readouterr().out
    assert f"folder:   {models} (1 GGUF file(s) now" in checked
    config = load_config(target)
    assert config.server.listen_host == "127.0.0.1"
    assert config.app_for_key(key.group(1)) is config.apps["me"]
    assert key.group(1) not in target.read_text()  # only its hash is kept
    assert f'key_sha256 = "{key_digest(key.group(1)).hex()}"' in target.read_text()


def test_init_without_a_folder_to_standard_output_passes_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["init"]) == 0
    out, err = capsys.readouterr()
    assert "#   host: " in out
    assert 'The key of app "me"' in err
    target = tmp_path / "yard.toml"
    target.write_text(out)
    assert cli.main(["check", str(target)]) == 0


def test_init_never_overwrites_a_file_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "yard.toml"
    target.write_text("mine")
    assert cli.main(["init", "--config", str(target)]) == 2
    assert "exists; give --force" in capsys.readouterr().err
    assert target.read_text() == "mine"
    assert cli.main(["init", "--config", str(target), "--force"]) == 0
    assert target.read_text().startswith("# yard's configuration")


def test_check_fails_on_a_folder_whose_server_cannot_be_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "yard.toml"
    assert cli.main(["init", "--models", str(tmp_path), "--config", str(target)]) == 0
    monkeypatch.setenv("YARD_LLAMA_SERVER", str(tmp_path / "no-such-server"))
    assert cli.main(["check", str(target)]) == 1
    assert "defaults.llama.command[0] (the models folder's): YARD_LLAMA_SERVER=" in (
        capsys.readouterr().err
    )
