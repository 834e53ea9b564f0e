"""The profile store keeps a parallel range's learned line beside the context's."""

from __future__ import annotations

from pathlib import Path

from tests.memory.test_profiles import H200, write_config
from yard.core.spec import Profile
from yard.memory.profiles import open_profile_store


async def test_the_slot_count_and_its_slopes_are_stored_and_read_back(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    store = await open_profile_store(config, devices=H200)
    line = Profile(
        gpu_bytes=3 << 30,
        host_bytes=1 << 30,
        load_s=4.5,
        context=16384,
        gpu_per_token=131072.0,
        host_per_token=0.0,
        parallel=4,
        gpu_per_slot=float(2 << 30),
        host_per_slot=1048576.0,
    )
    # Every field set: a field the store forgets reads back as None and fails.
    assert all(getattr(line, name) is not None for name in Profile.__dataclass_fields__)
    try:
        await store.store("llm", line)
        assert await store.get("llm") == line
        [history] = await store.history("llm")
        assert history.profile == line
        await store.put("echo", Profile(gpu_bytes=0, host_bytes=1 << 20, load_s=1))
        plain = await store.get("echo")
        assert plain is not None and plain.parallel is None and plain.host_per_slot is None
    finally:
        await store.aclose()
