"""Profiles in PostgreSQL: one measurement serves every node with the same
card, model file and command; a different card or file is measured anew."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from yard.cluster.pg import PgDatabase
from yard.cluster.profiles import cluster_key
from yard.cluster.schema import MIGRATIONS
from yard.core.spec import Profile
from yard.memory.profiles import Profiles
from yard.ports import ProfileStore

H200 = "NVIDIA H200 150754820096 bytes"
L4 = "NVIDIA L4 24152899584 bytes"
MEASURED = Profile(gpu_bytes=6_000_000_000, host_bytes=900_000_000, load_s=4.5, context=8192)


@dataclass(frozen=True)
class Backend:
    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    gpus: tuple[str, ...] = ("gpu0",)
    gpu_count: int = 1
    model_file: Path | None = None


@dataclass(frozen=True)
class Server:
    data_dir: Path


@dataclass(frozen=True)
class Config:
    path: Path
    server: Server
    backends: Mapping[str, Backend]


def host(root: Path, *, gpu: str = "gpu0", model: bytes = b"GGUF" * 1000) -> Config:
    """A node's configuration: its own directory, its own copy of the model."""
    root.mkdir(parents=True)
    (root / "voice.gguf").write_bytes(model)
    os.utime(root / "voice.gguf", ns=(len(str(root)) * 10**9, len(str(root)) * 10**9))
    backend = Backend(
        name="tts",
        command=("tts-server", "--model", "{config_dir}/voice.gguf", "--port", "{port}"),
        env={"TOKEN": "secret"},
        gpus=(gpu,),
    )
    return Config(path=root / "yard.toml", server=Server(root / "data"), backends={"tts": backend})


@pytest.fixture
async def db(postgres_dsn: str) -> AsyncIterator[PgDatabase]:
    db = await PgDatabase.open(postgres_dsn, MIGRATIONS)
    try:
        yield db
    finally:
        await db.close()


def store(db: PgDatabase, config: Config, node: str, label: str = H200) -> Profiles:
    gpu = config.backends["tts"].gpus[0]
    return Profiles(
        db,
        config,
        devices={gpu: label},
        clock=lambda: 1000.0,
        portable=cluster_key,
        node=node,
    )


def _is_profile_store(store: Profiles) -> ProfileStore:
    return store  # mypy: the engine's port


async def test_a_node_with_the_same_card_uses_the_profile_another_measured(
    db: PgDatabase, tmp_path: Path
) -> None:
    one = store(db, host(tmp_path / "one", gpu="gpu0"), "one")
    # Another host: other paths, other mtimes, the card under another name.
    two = store(db, host(tmp_path / "other-host", gpu="gpu1"), "two")
    assert await two.get("tts") is None
    await one.put("tts", MEASURED)
    assert await two.get("tts") == MEASURED
    record = await two.record("tts")
    assert record is not None
    assert (record.source, record.measured_at, record.parts["gpus"]) == (
        "measured",
        1000.0,
        [H200],
    )
    raised = Profile(gpu_bytes=7_000_000_000, host_bytes=900_000_000, load_s=4.5, context=8192)
    await two.put("tts", raised)
    assert await one.get("tts") == raised
    assert [(r.source, r.profile) for r in await one.history("tts")] == [
        ("raised", raised),
        ("measured", MEASURED),
    ]
    await one.forget("tts")
    assert await two.get("tts") is None
    assert await one.get("unknown") is None


async def test_another_card_or_another_model_file_is_measured_anew(
    db: PgDatabase, tmp_path: Path
) -> None:
    h200 = store(db, host(tmp_path / "a"), "a")
    l4 = store(db, host(tmp_path / "b"), "b", label=L4)
    requantised = store(db, host(tmp_path / "c", model=b"GGUF" * 900), "c")
    await h200.store("tts", MEASURED, steady_gpu_bytes=5_000_000_000)
    assert await l4.get("tts") is None
    assert await requantised.get("tts") is None
    keys = {(await s.key("tts")).digest for s in (h200, l4, requantised)}
    assert len(keys) == 3
    record = await h200.record("tts")
    assert record is not None and (record.source, record.steady_gpu_bytes) == (
        "probe",
        5_000_000_000,
    )
    with pytest.raises(KeyError):
        await h200.store("unknown", MEASURED)


async def test_every_field_of_a_profile_comes_back_as_stored(
    db: PgDatabase, tmp_path: Path
) -> None:
    # Every field of Profile set, none at its default: a column the store
    # forgets reads back as None and the comparison fails.
    full = Profile(
        gpu_bytes=6_500_000_000,
        host_bytes=950_000_000,
        load_s=5.25,
        context=8192,
        gpu_per_token=131072.5,
        host_per_token=1024.25,
        parallel=3,
        gpu_per_slot=67_108_864.5,
        host_per_slot=2_097_152.25,
    )
    assert all(getattr(full, name) is not None for name in Profile.__dataclass_fields__)
    one = store(db, host(tmp_path / "one"), "one")
    two = store(db, host(tmp_path / "two", gpu="gpu1"), "two")
    await one.store("tts", full, steady_gpu_bytes=6_000_000_000, steady_host_bytes=900_000_000)
    assert await two.get("tts") == full
    record = await two.record("tts")
    assert record is not None
    assert (record.profile, record.steady_gpu_bytes, record.steady_host_bytes) == (
        full,
        6_000_000_000,
        900_000_000,
    )
    assert [r.profile for r in await two.history("tts")] == [full]


async def test_a_profile_stored_before_the_parallel_columns_reads_without_slots(
    postgres_dsn: str, tmp_path: Path
) -> None:
    # A cluster database made by a yard before the slot columns: its rows
    # read back with no slot count and no per-slot slopes, and new rows keep them.
    config = host(tmp_path / "one")
    old = await PgDatabase.open(postgres_dsn, MIGRATIONS[:4])
    try:
        key = await store(old, config, "one").key("tts")
        columns = "key, backend, parts, gpu_bytes, host_bytes, load_s, source, measured_at, node"
        await old.execute(
            f"INSERT INTO profiles ({columns}, context) "
            "VALUES (?, 'tts', '{}', 6000000000, 900000000, 4.5, 'measured', 1.0, 'one', 8192)",
            (key.digest,),
        )
    finally:
        await old.close()
    db = await PgDatabase.open(postgres_dsn, MIGRATIONS)
    try:
        upgraded = store(db, config, "one")
        assert await upgraded.get("tts") == MEASURED
        slots = Profile(
            gpu_bytes=7_000_000_000, host_bytes=1, load_s=1.0, parallel=2, gpu_per_slot=5.0
        )
        await upgraded.put("tts", slots)
        assert await upgraded.get("tts") == slots
    finally:
        await db.close()
