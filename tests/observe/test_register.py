from __future__ import annotations

from pathlib import Path
from typing import cast

from quart_trio import QuartTrio

from yard.config import load_config
from yard.engine import Engine
from yard.observe import Observer, install
from yard.testing.engine import FakeEngine


async def test_an_observer_from_the_configuration_serves_its_engine_and_settings(
    tmp_path: Path, engine: FakeEngine
) -> None:
    path = tmp_path / "yard.toml"
    path.write_text(
        f'[server]\nadmin_key = "k"\ndata_dir = "{tmp_path}"\n\n'
        "[scheduler]\nprofile_margin = 1.5\n\n"
        '[backends.llm]\ncommand = ["llm-server", "--port", "{port}"]\nmodels = ["tiny"]\n'
    )
    built = Observer.from_config(load_config(path), engine=cast(Engine, engine), started_at=5.0)
    app = QuartTrio(__name__)
    observer = install(app, built)
    assert app.extensions[Observer.KEY] is observer is built
    assert (observer.admin_key, observer.profile_margin) == ("k", 1.5)
    client = app.test_client()
    assert (await client.get("/admin/status")).status_code == 401
    status = await (
        await client.get("/admin/status", headers={"Authorization": "Bearer k"})
    ).get_json()
    assert status["started_at"] == 5.0
    assert status["backends"][0]["models"] == ["tiny"]
    gpu = next(d for d in status["devices"] if d["name"] == "gpu0")
    assert gpu["backends"][0]["reserved_bytes"] == 6 * 2**30  # 4 GiB profile x 1.5
    assert (await client.get("/metrics")).status_code == 200
