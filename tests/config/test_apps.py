"""``[apps.NAME]``: model scopes, limits, weights and keys held as hashes."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest

from yard.api.intake import authenticate
from yard.config import AppConfig, Config, ConfigError, key_digest, load_config
from yard.errors import Rejected

BACKENDS = """
[backends.llm]
models = ["llama-8b", "llama-70b", "qwen-7b"]
command = ["server", "--port", "{port}"]

[backends.tts]
api = "plain"
command = ["server", "--port", "{port}"]
"""

GUEST_KEY = "sk-guest-secret"
GUEST_HASH = hashlib.sha256(GUEST_KEY.encode()).hexdigest()


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Config:
    path = tmp_path / "yard.toml"
    path.write_text(BACKENDS + textwrap.dedent(text))
    return load_config(path, env=env or {})


def errors_of(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    where = f"{tmp_path / 'yard.toml'}: "
    return [e.removeprefix(where) for e in info.value.errors]


def test_an_app_without_the_new_keys_may_use_everything_without_limits(tmp_path: Path) -> None:
    app = load(tmp_path, "[apps.a]\nkey = 'ka'\n").apps["a"]
    assert (app.models, app.max_concurrent, app.max_queued, app.weight) == (None, None, None, 1.0)
    assert app.key_sha256 is None and app.key == "ka"
    assert app.may_use("anything")


def test_every_app_key_is_read(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        f"""
        [apps.guests]
        key_sha256 = "{GUEST_HASH.upper()}"
        models = ["llama-8b", "qwen-*"]
        max_concurrent = 2
        max_queued = 10
        weight = 0.5
        """,
    )
    app = config.apps["guests"]
    assert app.key == "" and app.key_sha256 == bytes.fromhex(GUEST_HASH)
    assert app.models == ("llama-8b", "qwen-*")
    assert (app.max_concurrent, app.max_queued, app.weight) == (2, 10, 0.5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("key_sha256 = 'abc'", "apps.a.key_sha256: must be 64 hexadecimal digits"),
        (f"key_sha256 = '{'g' * 64}'", "apps.a.key_sha256: must be 64 hexadecimal digits"),
        ("key_sha256 = 5", "apps.a.key_sha256: must be a string"),
        (
            f"key = 'k'\nkey_sha256 = '{GUEST_HASH}'",
            "apps.a: give either key or key_sha256, not both",
        ),
        (
            f"key = 'k'\nkey_env = 'K'\nkey_sha256 = '{GUEST_HASH}'",
            "apps.a: give one of key, key_env or key_sha256",
        ),
        ("default_priority = 1", 'apps.a: needs key = "...", key_env = "VARIABLE" or key_sha256'),
        ("key = 'k'\nmax_queued = 0", "apps.a.max_queued: must be greater than 0, got 0"),
        ("key = 'k'\nmax_queued = -3", "apps.a.max_queued: must be greater than 0, got -3"),
        ("key = 'k'\nmax_queued = 1.5", "apps.a.max_queued: must be an integer, got a number"),
        ("key = 'k'\nmax_queued = true", "apps.a.max_queued: must be an integer, got a boolean"),
        ("key = 'k'\nmax_concurrent = 0", "apps.a.max_concurrent: must be greater than 0, got 0"),
        ("key = 'k'\nmax_concurrent = '2'", "apps.a.max_concurrent: must be an integer"),
        ("key = 'k'\nweight = 0", "apps.a.weight: must be greater than 0, got 0.0"),
        ("key = 'k'\nweight = -1.5", "apps.a.weight: must be greater than 0, got -1.5"),
        ("key = 'k'\nweight = 'half'", "apps.a.weight: must be a number"),
        ("key = 'k'\nmodels = []", "apps.a.models: is empty: leave it out"),
        ("key = 'k'\nmodels = 'llama-8b'", "apps.a.models: must be a list of strings"),
        ("key = 'k'\nmodels = ['']", "apps.a.models[0]: must be a non-empty string"),
        (
            "key = 'k'\nmodels = ['llama-8b', 'lama-*']",
            "apps.a.models[1]: 'lama-*' matches no model of any backend "
            "(models: llama-8b, llama-70b, qwen-7b, tts)",
        ),
        ("key = 'k'\nmodels = ['LLAMA-8B']", "apps.a.models[0]: 'LLAMA-8B' matches no model"),
        ("key = 'k'\nmax_queue = 3", "apps.a.max_queue: unknown key; did you mean 'max_queued'?"),
    ],
)
def test_each_app_error_names_the_key(tmp_path: Path, text: str, expected: str) -> None:
    errors = errors_of(tmp_path, f"[apps.a]\n{text}\n")
    assert any(e.startswith(expected) for e in errors), errors


def test_a_hashed_key_equal_to_another_apps_key_is_an_error(tmp_path: Path) -> None:
    errors = errors_of(
        tmp_path, f"[apps.a]\nkey = '{GUEST_KEY}'\n[apps.b]\nkey_sha256 = '{GUEST_HASH}'\n"
    )
    assert errors == [
        "apps.b.key_sha256: the same key is already used by app 'a'; keys tell apps apart, "
        "give each its own"
    ]


def test_a_hashed_key_equal_to_the_admin_key_is_an_error(tmp_path: Path) -> None:
    errors = errors_of(
        tmp_path, f"[server]\nadmin_key = '{GUEST_KEY}'\n[apps.a]\nkey_sha256 = '{GUEST_HASH}'\n"
    )
    assert errors == ["apps.a.key: is the same as the admin key; give each its own"]


def test_a_hashed_key_is_accepted_and_a_wrong_one_refused(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        f"[apps.inline]\nkey = 'sk-inline'\n[apps.guests]\nkey_sha256 = '{GUEST_HASH}'\n",
    )
    app, consumed = authenticate(config, f"Bearer {GUEST_KEY}".encode())
    assert (app.name, consumed) == ("guests", True)
    assert authenticate(config, b"Bearer sk-inline")[0].name == "inline"
    for wrong in (GUEST_KEY + "x", GUEST_HASH, GUEST_KEY[:-1], ""):
        assert config.app_for_key(wrong) is None
        with pytest.raises(Rejected) as info:
            authenticate(config, f"Bearer {wrong}".encode())
        assert (info.value.status, info.value.code) == (401, "invalid_api_key")
    # A key that is no UTF-8 text is refused, not an error.
    assert config.app_for_key("sk-\udc80") is None


def test_the_digest_is_of_the_keys_utf8_bytes() -> None:
    assert key_digest(GUEST_KEY).hex() == GUEST_HASH
    app = AppConfig(
        name="a", key_sha256=bytes.fromhex(GUEST_HASH), default_priority=0, max_priority=1
    )
    assert app.has_key(GUEST_KEY) and not app.has_key("other")


def test_model_patterns_match_whole_names_case_sensitively(tmp_path: Path) -> None:
    config = load(tmp_path, "[apps.a]\nkey = 'k'\nmodels = ['llama-8b', 'qwen-*', 't?s']\n")
    app = config.apps["a"]
    assert [m for m, _ in config.models() if app.may_use(m)] == ["llama-8b", "qwen-7b"]
    assert not app.may_use("llama-8b-instruct") and not app.may_use("xllama-8b")
    assert not app.may_use("QWEN-7b")
    # /backends/NAME: by the backend's models, or its name when it names none.
    assert app.may_reach(config.backends["llm"]) and app.may_reach(config.backends["tts"])
    only_70b = load(tmp_path, "[apps.a]\nkey = 'k'\nmodels = ['llama-70b']\n").apps["a"]
    assert only_70b.may_reach(config.backends["llm"])
    assert not only_70b.may_reach(config.backends["tts"])
    # Reaching a backend is not using all of it: llm also serves llama-70b.
    assert not app.may_use_all(config.backends["llm"]) and app.may_use_all(config.backends["tts"])


def test_the_example_file_s_hashed_key_is_the_documented_one() -> None:
    example = Path(__file__).resolve().parents[2] / "config" / "example.toml"
    guests = load_config(example, env={}).apps["guests"]
    assert guests.has_key("sk-guests-change-me")
