"""``[models]``: a folder of GGUF files is a configuration (yard.config.folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from yard.config import ConfigError, load_config
from yard.config.folder import ModelFile, backends_for, model_files, model_name


def _touch(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"GGUF")


def test_a_model_is_named_after_its_file() -> None:
    assert model_name(Path("/m/Qwen2.5-7B-Instruct-Q4_K_M.gguf")) == "Qwen2.5-7B-Instruct-Q4_K_M"
    assert model_name(Path("/m/big-00001-of-00003.gguf")) == "big"
    assert model_name(Path("/m/my model (v2).gguf")) == "my-model-v2"


def test_only_first_parts_of_models_are_listed(tmp_path: Path) -> None:
    _touch(
        tmp_path,
        "b.gguf",
        "a.GGUF",
        "big-00001-of-00002.gguf",
        "big-00002-of-00002.gguf",
        "mmproj-a.gguf",
        ".hidden.gguf",
        "notes.txt",
    )
    (tmp_path / "dir.gguf").mkdir()
    assert [p.name for p in model_files(tmp_path)] == [
        "a.GGUF",
        "b.gguf",
        "big-00001-of-00002.gguf",
    ]
    assert model_files(tmp_path / "missing") == []


def _config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "yard.toml"
    path.write_text(f'[models]\ndir = "models"\n{extra}')
    return path


def test_each_file_gets_a_llama_server_backend_with_its_trained_context(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, 'aliases = { small = ["tiny"] }\n'))
    assert config.folder is not None and config.folder.dir == tmp_path / "models"
    files = [
        ModelFile(path=tmp_path / "models" / "small.gguf", trained_context=1024),
        ModelFile(path=tmp_path / "models" / "large.gguf", trained_context=32768),
        ModelFile(path=tmp_path / "models" / "odd.gguf", trained_context=None),
    ]
    backends, notes = backends_for(
        config.folder,
        files,
        gpus=("gpu0", "gpu1"),
        taken={},
        server=config.server,
        path=config.path,
    )
    assert notes == []
    small, large, odd = backends["small"], backends["large"], backends["odd"]
    assert small.models == ("small", "tiny")
    assert small.command[0] == "{llama_server}" and "{context}" in small.command
    assert small.model_file == tmp_path / "models" / "small.gguf"
    assert (small.context, large.context, odd.context) == (
        (1024, 1024),
        (2048, 32768),
        (2048, 4096),
    )
    assert large.gpus == ("gpu0", "gpu1") and large.gpu_count == 1
    merged = config.with_folder(backends)
    assert merged.backend_for_model("tiny") is small
    assert merged.from_folder == {"small", "large", "odd"}
    # The next scan replaces the folder's backends, not the hand-written ones.
    assert set(merged.with_folder({}).backends) == set()


def test_a_hand_written_backend_wins_over_a_file_of_the_same_model(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        '[backends.mine]\nmodels = ["small"]\ncommand = ["{python}", "-m", "x", "{port}"]\n',
    )
    config = load_config(path)
    assert config.folder is not None
    taken = {"small": "mine"}
    files = [ModelFile(path=tmp_path / "models" / "small.gguf", trained_context=2048)]
    backends, notes = backends_for(
        config.folder, files, gpus=(), taken=taken, server=config.server, path=path
    )
    assert backends == {}
    assert notes == [
        f"{tmp_path / 'models' / 'small.gguf'}: skipped: the model 'small' is already served "
        "by backend 'mine'"
    ]


def test_defaults_llama_is_the_template_and_its_mistakes_name_it(tmp_path: Path) -> None:
    good = _config(
        tmp_path,
        "[defaults.llama]\nidle_ttl_s = 60\ngpus = [0]\n"
        'command = ["{llama_server}", "--port", "{port}", "-m", "{model_file}",\n'
        '           "-c", "{context}"]\n',
    )
    config = load_config(good)
    assert config.folder is not None
    files = [ModelFile(path=tmp_path / "models" / "a.gguf", trained_context=8192)]
    backends, _ = backends_for(
        config.folder, files, gpus=("gpu0", "gpu1"), taken={}, server=config.server, path=good
    )
    assert backends["a"].idle_ttl_s == 60 and backends["a"].gpus == ("gpu0",)
    bad = _config(tmp_path, '[defaults.llama]\nmodels = ["x"]\nslots = 0\n')
    with pytest.raises(ConfigError) as refused:
        load_config(bad)
    assert any(
        e.startswith(f"{bad}: defaults.llama.models: unknown key") for e in refused.value.errors
    )
    assert f"{bad}: defaults.llama.slots: must be at least 1, got 0" in refused.value.errors


def test_an_app_may_be_scoped_to_a_model_of_the_folder(tmp_path: Path) -> None:
    _touch(tmp_path / "models", "chat.gguf")
    path = _config(tmp_path, '[apps.a]\nkey = "k"\nmodels = ["chat"]\n')
    assert load_config(path).apps["a"].models == ("chat",)


def test_the_command_line_sets_the_folder_and_its_aliases(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path)).with_overrides(
        models=tmp_path / "other", aliases=["a=b", "a=c"]
    )
    assert config.folder is not None
    assert config.folder.dir == tmp_path / "other"
    assert config.folder.aliases == {"a": ("b", "c")}
    with pytest.raises(ConfigError, match="expected MODEL=NAME"):
        config.with_overrides(aliases=["nothing"])
