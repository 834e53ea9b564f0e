"""The [jobs] batch_* keys: defaults, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from yard.config import ConfigError, JobsConfig, load_config


def _load(tmp_path: Path, jobs: str) -> JobsConfig:
    path = tmp_path / "yard.toml"
    path.write_text(f"[jobs]\n{jobs}\n")
    return load_config(path).jobs


def test_defaults_and_values(tmp_path: Path) -> None:
    defaults = _load(tmp_path, "")
    assert defaults.batch_max_file_bytes == 50 * 2**20
    assert defaults.batch_max_window_s == 7 * 24 * 3600
    jobs = _load(
        tmp_path,
        'batch_max_file_bytes = "1MiB"\nbatch_max_files_per_app = 3\nbatch_max_lines = 10\n'
        "batch_max_window_s = 7200\nbatch_queued_lines = 2\nbatch_priority_drop = 0\n",
    )
    assert (
        jobs.batch_max_file_bytes,
        jobs.batch_max_files_per_app,
        jobs.batch_max_lines,
        jobs.batch_max_window_s,
        jobs.batch_queued_lines,
        jobs.batch_priority_drop,
    ) == (2**20, 3, 10, 7200.0, 2, 0.0)


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("batch_max_file_bytes = 0", "jobs.batch_max_file_bytes"),
        ('batch_max_file_bytes = "1TiB"', "jobs.batch_max_file_bytes"),
        ("batch_max_files_per_app = 0", "jobs.batch_max_files_per_app"),
        ("batch_max_lines = 0", "jobs.batch_max_lines"),
        ("batch_max_lines = 1.5", "jobs.batch_max_lines"),
        ("batch_max_window_s = 60", "jobs.batch_max_window_s"),
        ("batch_queued_lines = 0", "jobs.batch_queued_lines"),
        ("batch_priority_drop = -1", "jobs.batch_priority_drop"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, line)
    assert key in str(info.value)
