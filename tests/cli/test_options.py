"""Every command takes its options in any order (issue 24, item 5)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from yard import cli


def _valid(tmp_path: Path) -> Path:
    path = tmp_path / "yard.toml"
    path.write_text('[server]\nlisten = "127.0.0.1:8080"\n')
    return path


def test_check_takes_the_file_positionally_or_as_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _valid(tmp_path)
    assert cli.main(["check", str(path)]) == 0
    assert cli.main(["check", "--config", str(path)]) == 0
    assert cli.main(["check", f"--config={path}"]) == 0
    assert f"{path}: OK" in capsys.readouterr().out


def test_check_refuses_two_different_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _valid(tmp_path)
    assert cli.main(["check", str(path), "--config", str(tmp_path / "other.toml")]) == 2
    assert "two files given" in capsys.readouterr().err


def test_options_of_a_command_may_follow_its_action() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--key")
    parser.add_argument("--config")
    parser.add_argument("--verbose", action="store_true")
    sub = parser.add_subparsers(dest="action")
    sub.add_parser("list").add_argument("--limit")
    argv = ["jobs", "list", "--limit", "3", "--key", "K", "--verbose", "--config=f.toml"]
    assert cli.hoist(argv, "jobs", parser) == [
        "jobs",
        "--key",
        "K",
        "--verbose",
        "--config=f.toml",
        "list",
        "--limit",
        "3",
    ]
    # Past "--" nothing moves.
    assert cli.hoist(["jobs", "list", "--", "--key", "K"], "jobs", parser) == [
        "jobs",
        "list",
        "--",
        "--key",
        "K",
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs", "list", "--key", "K", "--url", "http://127.0.0.1:9"],
        ["jobs", "--url", "http://127.0.0.1:9", "list", "--key", "K"],
        ["jobs", "--key", "K", "list", "--url", "http://127.0.0.1:9"],
    ],
)
def test_jobs_takes_its_options_before_or_after_the_action(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens on port 9: the options were understood, the call failed.
    assert cli.main(argv) == 2
    assert "cannot reach yard at http://127.0.0.1:9" in capsys.readouterr().err


def test_jobs_reads_the_address_from_config_given_after_the_action(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "yard.toml"
    path.write_text(f'[server]\nlisten = "127.0.0.1:9"\ndata_dir = "{tmp_path / "data"}"\n')
    assert cli.main(["jobs", "list", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot reach yard at http://127.0.0.1:9" in err
    assert f"no yard is running on {tmp_path / 'data'}" in err
