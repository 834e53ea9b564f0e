"""The configuration of announcements: max_announcements ([scheduler] and per
app), lead_margin_s, and [[announcements]], with errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.test_apps import errors_of, load
from yard.config import announcements as recurring

APP = """
[apps.radio]
key = "sk-radio"
default_priority = 50
max_priority = 80
"""

NEWS = """
[[announcements]]
model = "llama-8b"
app = "radio"
schedule = "50 * * * *"
window_s = 600
count = 3
priority = 90
"""


def test_the_keys_are_read(tmp_path: Path) -> None:
    text = (
        "[scheduler]\nmax_announcements = 5\nlead_margin_s = 3.5\n"
        + APP
        + "max_announcements = 2\n"
        + NEWS
    )
    config = load(tmp_path, text)
    assert config.scheduler.max_announcements == 5
    assert config.scheduler.lead_margin_s == 3.5
    assert config.apps["radio"].max_announcements == 2
    [news] = config.announcements
    assert (news.model, news.app, news.schedule, news.window_s, news.count, news.priority) == (
        "llama-8b",
        "radio",
        "50 * * * *",
        600.0,
        3,
        90.0,
    )


def test_the_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, APP)
    assert config.scheduler.max_announcements == 16
    assert config.scheduler.lead_margin_s == 2.0
    assert config.apps["radio"].max_announcements is None
    assert config.announcements == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (APP + "max_announcements = -1\n", "apps.radio.max_announcements: must be 0 or more"),
        ("[scheduler]\nmax_announcements = -1\n" + APP, "scheduler: lead_margin_s and max_"),
        ("[scheduler]\nlead_margin_s = -1\n" + APP, "scheduler: lead_margin_s and max_"),
        (APP + NEWS.replace('"50 * * * *"', '"50 * *"'), "announcements[0].schedule: '50 * *'"),
        (APP + NEWS.replace('"llama-8b"', '"gpt-9"'), "announcements[0].model: must name"),
        (APP + NEWS.replace('"radio"', '"tv"'), "announcements[0].app: must name"),
        (APP + NEWS.replace("600", "0"), "announcements[0].window_s: must be"),
    ],
)
def test_each_error_names_the_key(tmp_path: Path, text: str, expected: str) -> None:
    assert any(e.startswith(expected) for e in errors_of(tmp_path, text)), errors_of(tmp_path, text)


def test_announcements_must_be_an_array_of_tables() -> None:
    with pytest.raises(ValueError, match=r"^announcements: must be an array of tables"):
        recurring.parse(3, apps=["radio"], models=["llama-8b"])
