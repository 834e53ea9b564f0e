"""The profile key and the SQLite profile store."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from yard.config import Config, load_config
from yard.core.spec import Profile
from yard.memory.profiles import (
    MemoryProfileStore,
    Profiles,
    footprint_key,
    open_profile_store,
)

GIB = 1 << 30
H200 = {"gpu0": "NVIDIA H200, 139.8 GiB", "gpu1": "NVIDIA H200, 139.8 GiB"}


def write_config(
    root: Path,
    *,
    ctx: int = 2048,
    gpus: str = '["gpu0"]',
    server: str = "bin/llama-server",
) -> Config:
    """A config with one llama.cpp-like backend whose executable and model
    file live under ``root``."""
    (root / "models").mkdir(parents=True, exist_ok=True)
    (root / "bin").mkdir(exist_ok=True)
    model = root / "models" / "tiny.gguf"
    if not model.exists():
        model.write_bytes(b"GGUF" + bytes(1000))
    exe = root / "bin" / "llama-server"
    if not exe.exists():
        exe.write_text("#!/bin/sh\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    path = root / "yard.toml"
    path.write_text(
        f"""
[server]
data_dir = "data"

[devices.gpu0]
[devices.gpu1]

[backends.llm]
models = ["tiny"]
command = ['{server}', "--port", "{{port}}", "-m", "{{model_file}}", "-c", "{ctx}"]
model_file = "{{config_dir}}/models/tiny.gguf"
gpus = {gpus}

[backends.echo]
models = ["echo"]
command = ["{{python}}", "-m", "yard.testing.backend", "--port", "{{port}}"]
"""
    )
    return load_config(path)


def key(config: Config, name: str = "llm", devices: dict[str, str] | None = None) -> str:
    return footprint_key(
        config.backends[name],
        config_dir=config.path.parent,
        data_dir=config.server.data_dir,
        devices=H200 if devices is None else devices,
    ).digest


def test_the_key_is_stable_while_nothing_changes(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    assert key(config) == key(write_config(tmp_path))
    parts = footprint_key(
        config.backends["llm"], config_dir=tmp_path, data_dir=config.server.data_dir
    ).parts
    model = str((tmp_path / "models" / "tiny.gguf").resolve())
    assert model in parts["files"]  # type: ignore[operator]
    assert parts["executable"] == {
        "path": str((tmp_path / "bin" / "llama-server").resolve()),
        "size": 10,
        "mtime_ns": (tmp_path / "bin" / "llama-server").stat().st_mtime_ns,
    }


def test_the_key_changes_with_the_command_arguments(tmp_path: Path) -> None:
    assert key(write_config(tmp_path, ctx=2048)) != key(write_config(tmp_path, ctx=4096))


def test_the_key_changes_when_the_model_file_changes(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    before = key(config)
    model = tmp_path / "models" / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(2000))  # re-quantised: another size
    after_size = key(config)
    assert after_size != before
    info = model.stat()
    os.utime(model, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))  # touched
    assert key(config) not in {before, after_size}


def test_the_key_changes_with_the_devices(tmp_path: Path) -> None:
    config = write_config(tmp_path, gpus='["gpu0"]')
    other_gpu = write_config(tmp_path, gpus='["gpu1"]')
    assert key(config) != key(other_gpu)
    other_board = {"gpu0": "NVIDIA GeForce RTX 4090, 23.6 GiB"}
    assert key(config) != key(config, devices=other_board)


def test_the_key_changes_with_the_server_version(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    before = key(config)
    exe = tmp_path / "bin" / "llama-server"
    exe.write_text("#!/bin/sh\n# b4567\n")  # a rebuilt server
    assert key(config) != before


async def test_profiles_persist_across_reopen(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    store = await open_profile_store(config, devices=H200)
    profile = Profile(gpu_bytes=3 * GIB, host_bytes=GIB, load_s=4.5)
    await store.store(
        "llm", profile, steady_gpu_bytes=2 * GIB, steady_host_bytes=GIB // 2, source="probe"
    )
    await store.aclose()

    again = await open_profile_store(config, devices=H200)
    assert await again.get("llm") == profile
    record = await again.record("llm")
    assert record is not None
    assert (record.steady_gpu_bytes, record.steady_host_bytes, record.source) == (
        2 * GIB,
        GIB // 2,
        "probe",
    )
    assert record.measured_at > 0
    assert await again.get("echo") is None
    assert await again.get("no-such-backend") is None
    await again.aclose()


async def test_a_changed_footprint_finds_no_profile_and_going_back_finds_it_again(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, ctx=2048)
    store = await open_profile_store(config)
    profile = Profile(gpu_bytes=GIB, host_bytes=GIB, load_s=1.0)
    await store.put("llm", profile)
    await store.aclose()

    bigger = await open_profile_store(write_config(tmp_path, ctx=8192))
    assert await bigger.get("llm") is None
    await bigger.aclose()

    back = await open_profile_store(write_config(tmp_path, ctx=2048))
    assert await back.get("llm") == profile
    await back.aclose()


async def test_engine_puts_keep_the_steady_state_and_build_a_history(tmp_path: Path) -> None:
    clock = iter([100.0, 200.0, 300.0])
    config = write_config(tmp_path)
    base = await open_profile_store(config)
    store = Profiles(base.db, config, clock=lambda: next(clock))
    await store.store(
        "llm", Profile(gpu_bytes=GIB, host_bytes=GIB, load_s=2.0), steady_gpu_bytes=GIB // 2
    )
    raised = Profile(gpu_bytes=2 * GIB, host_bytes=GIB, load_s=2.0)
    await store.put("llm", raised)
    record = await store.record("llm")
    assert record is not None
    assert record.profile == raised
    assert record.source == "raised"
    assert record.steady_gpu_bytes == GIB // 2
    history = await store.history("llm")
    assert [(h.source, h.measured_at, h.profile.gpu_bytes) for h in history] == [
        ("raised", 200.0, 2 * GIB),
        ("probe", 100.0, GIB),
    ]
    await store.forget("llm")
    assert await store.get("llm") is None
    assert len(await store.history("llm")) == 2  # forgetting keeps the history
    await store.put("llm", raised)
    assert (await store.record("llm")).source == "measured"  # type: ignore[union-attr]
    await store.aclose()


async def test_the_memory_store_fake_behaves_like_the_port() -> None:
    store = MemoryProfileStore()
    profile = Profile(gpu_bytes=1, host_bytes=2, load_s=3.0)
    assert await store.get("a") is None
    await store.put("a", profile)
    assert await store.get("a") == profile
    await store.forget("a")
    assert await store.get("a") is None
    assert store.puts == [("a", profile)]


def test_the_key_follows_the_llama_server_behind_the_demo_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, server="{python}', '-m', 'yard.demo.llama_server")
    binary = tmp_path / "bin" / "llama-server"
    monkeypatch.setenv("YARD_LLAMA_SERVER", str(binary))
    before = key(config)
    assert footprint_key(
        config.backends["llm"], config_dir=tmp_path, data_dir=config.server.data_dir
    ).parts["server"] == {
        "path": str(binary.resolve()),
        "size": binary.stat().st_size,
        "mtime_ns": binary.stat().st_mtime_ns,
    }
    binary.write_text("#!/bin/sh\n# a newer build\n")
    assert key(config) != before


def test_the_key_covers_the_environment_without_storing_its_values(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    backend = config.backends["llm"]
    secret = dataclasses.replace(backend, env={"HF_TOKEN": "hf_secret"})
    other = dataclasses.replace(backend, env={"HF_TOKEN": "hf_other"})
    keys = [
        footprint_key(b, config_dir=tmp_path, data_dir=config.server.data_dir)
        for b in (backend, secret, other)
    ]
    assert len({k.digest for k in keys}) == 3
    assert "hf_secret" not in json.dumps(keys[1].parts)
