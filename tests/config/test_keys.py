"""``yard key new APP``: a new key, shown once, and the line that holds its hash."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest

from yard import cli
from yard.config import load_config


def new_key(capsys: pytest.CaptureFixture[str], app: str) -> tuple[str, str]:
    """(the printed key, the whole output)."""
    assert cli.main(["key", "new", app]) == 0
    out = capsys.readouterr().out
    key = out.splitlines()[3].removeprefix("#     ")
    return key, out


def test_the_output_is_toml_whose_hash_is_of_the_printed_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key, out = new_key(capsys, "guests")
    assert "shown this once" in out and "[apps.guests]" in out
    assert len(key) == 43 and key.replace("-", "").replace("_", "").isalnum()
    assert tomllib.loads(out) == {"key_sha256": hashlib.sha256(key.encode()).hexdigest()}
    # Pasted into [apps.guests], the line loads and the printed key authenticates.
    path = tmp_path / "yard.toml"
    path.write_text("[apps.guests]\n" + out)
    config = load_config(path, env={})
    app = config.app_for_key(key)
    assert app is not None and app.name == "guests"


def test_each_call_makes_a_different_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert new_key(capsys, "a")[0] != new_key(capsys, "a")[0]


def test_an_app_name_with_a_dot_is_quoted_in_the_table_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out = new_key(capsys, "radio.night")
    assert '[apps."radio.night"]' in out
    assert list(tomllib.loads(out)) == ["key_sha256"]


def test_a_name_that_is_no_app_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["key", "new", "bad name"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "'bad name' is not an app name" in captured.err


def test_key_without_an_action_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["key"])
    assert info.value.code == 2
