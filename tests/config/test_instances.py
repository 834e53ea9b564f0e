"""[backends.NAME] instances = N: several processes of one backend behind its models."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.test_config import errors_of, load

NEWS = """
[backends.news]
models = ["news-llm", "news-llm-short"]
command = ["llama-server", "--port", "{{port}}"]
gpus = ["gpu0", "gpu1"]
slots = 2
{extra}

[backends.chat]
models = ["chat-llm"]
command = ["llama-server", "--port", "{{port}}"]
"""


def test_instances_become_backends_named_after_the_first(tmp_path: Path) -> None:
    config = load(tmp_path, NEWS.format(extra="instances = 3"))
    assert list(config.backends) == ["news", "news@2", "news@3", "chat"]
    second = config.backends["news@2"]
    assert second.instance_of == "news" and config.backends["news"].instance_of is None
    assert second.command == config.backends["news"].command
    assert second.gpus == ("gpu0", "gpu1") and second.slots == 2
    specs = {s.name: s for s in config.backend_specs()}
    assert [(s.name, s.instances, s.instance_of) for s in specs.values()] == [
        ("news", 3, None),
        ("news@2", 3, "news"),
        ("news@3", 3, "news"),
        ("chat", 1, None),
    ]


def test_a_model_is_listed_once_and_leads_to_the_first_instance(tmp_path: Path) -> None:
    config = load(tmp_path, NEWS.format(extra="instances = 2"))
    assert config.models() == [
        ("news-llm", "news"),
        ("news-llm-short", "news"),
        ("chat-llm", "chat"),
    ]
    backend = config.backend_for_model("news-llm-short")
    assert backend is not None and backend.name == "news"


def test_one_instance_is_the_default_and_adds_nothing(tmp_path: Path) -> None:
    config = load(tmp_path, NEWS.format(extra=""))
    assert list(config.backends) == ["news", "chat"]
    assert config.backends["news"].instances == 1


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("0", "backends.news.instances: must be between 1 and 8"),
        ("9", "backends.news.instances: must be between 1 and 8"),
        ("-1", "backends.news.instances: must be between 1 and 8"),
        ("2.5", "backends.news.instances: must be"),
        ("true", "backends.news.instances: must be"),
        ('"2"', "backends.news.instances: must be"),
    ],
)
def test_a_bad_count_is_an_error_naming_the_key(tmp_path: Path, value: str, error: str) -> None:
    errors = errors_of(tmp_path, NEWS.format(extra=f"instances = {value}"))
    assert any(error in e for e in errors), errors


def test_an_instance_name_cannot_be_taken_by_a_configured_backend(tmp_path: Path) -> None:
    text = NEWS.format(extra="instances = 2") + (
        '\n[backends."news@2"]\nmodels = ["other"]\ncommand = ["srv", "{port}"]\n'
    )
    errors = errors_of(tmp_path, text)
    assert any("backends.news@2: backend names use letters" in e for e in errors), errors


def test_a_model_of_an_instanced_backend_still_leads_to_one_backend(tmp_path: Path) -> None:
    text = NEWS.format(extra="instances = 2").replace('["chat-llm"]', '["news-llm"]')
    errors = errors_of(tmp_path, text)
    assert any(
        "backends.chat.models: model 'news-llm' is already served by backend 'news'" in e
        for e in errors
    ), errors


def test_the_load_penalty_is_a_quarter_by_default_and_set_globally_or_per_backend(
    tmp_path: Path,
) -> None:
    config = load(tmp_path, NEWS.format(extra="instances = 2"))
    assert config.scheduler.instance_load_penalty == 0.25
    assert all(s.instance_load_penalty is None for s in config.backend_specs())
    text = "[scheduler]\ninstance_load_penalty = 0.5\n" + NEWS.format(
        extra="instances = 2\ninstance_load_penalty = 1"
    )
    config = load(tmp_path, text)
    assert config.scheduler.instance_load_penalty == 0.5
    specs = {s.name: s for s in config.backend_specs()}
    assert specs["news"].instance_load_penalty == 1.0
    assert specs["news@2"].instance_load_penalty == 1.0  # every instance carries it
    assert specs["chat"].instance_load_penalty is None


@pytest.mark.parametrize("value", ["-0.1", "4.5", "inf", "nan", "true", '"0.5"'])
def test_a_bad_load_penalty_is_an_error_naming_the_key(tmp_path: Path, value: str) -> None:
    per_backend = errors_of(
        tmp_path, NEWS.format(extra=f"instances = 2\ninstance_load_penalty = {value}")
    )
    assert any("backends.news.instance_load_penalty: must be" in e for e in per_backend), (
        per_backend
    )
    text = f"[scheduler]\ninstance_load_penalty = {value}\n" + NEWS.format(extra="")
    global_ = errors_of(tmp_path, text)
    assert any("scheduler.instance_load_penalty: must be" in e for e in global_) or any(
        "scheduler: instance_load_penalty must be between 0 and 4" in e for e in global_
    ), global_


@pytest.mark.parametrize("value", ["0", "4", "0.25"])
def test_the_load_penalty_may_be_0_to_4(tmp_path: Path, value: str) -> None:
    text = f"[scheduler]\ninstance_load_penalty = {value}\n" + NEWS.format(
        extra=f"instances = 2\ninstance_load_penalty = {value}"
    )
    config = load(tmp_path, text)
    assert config.scheduler.instance_load_penalty == float(value)


def test_spread_windows_is_off_by_default_and_every_instance_carries_it(tmp_path: Path) -> None:
    specs = {s.name: s for s in load(tmp_path, NEWS.format(extra="instances = 2")).backend_specs()}
    assert not any(s.spread_windows for s in specs.values())
    text = NEWS.format(extra="instances = 2\nspread_windows = true")
    specs = {s.name: s for s in load(tmp_path, text).backend_specs()}
    assert specs["news"].spread_windows and specs["news@2"].spread_windows
    assert not specs["chat"].spread_windows


def test_a_spread_windows_that_is_not_true_or_false_is_an_error_naming_the_key(
    tmp_path: Path,
) -> None:
    errors = errors_of(tmp_path, NEWS.format(extra='instances = 2\nspread_windows = "yes"'))
    assert any("backends.news.spread_windows" in e for e in errors), errors
