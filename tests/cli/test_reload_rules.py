"""What a reload applies at once and what keeps its running value until a
restart (yard.app.reload)."""

from __future__ import annotations

from pathlib import Path

from yard.app.reload import _keep_restart_only
from yard.config import Config, load_config


def _load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "yard.toml"
    path.write_text(text)
    return load_config(path)


def test_listen_data_dir_and_app_limits_wait_for_a_restart_keys_do_not(tmp_path: Path) -> None:
    old = _load(tmp_path, '[server]\nlisten = "127.0.0.1:8080"\n[apps.a]\nkey = "k1"\n')
    new = _load(
        tmp_path,
        '[server]\nlisten = "127.0.0.1:9090"\ndata_dir = "elsewhere"\n'
        '[apps.a]\nkey = "k2"\nmax_queued = 3\n[apps.b]\nkey = "k3"\nweight = 2.0\n',
    )
    kept, warnings = _keep_restart_only(old, new)
    assert kept.server.listen_port == 8080
    assert kept.server.data_dir == old.server.data_dir
    assert kept.apps["a"].key == "k2" and "b" in kept.apps  # keys and apps: at once
    assert warnings == [
        "apps.a.max_queued: changed; the new value takes a restart of yard "
        "(the key and the models apply now)",
        "apps.b.weight: changed; the new value takes a restart of yard "
        "(the key and the models apply now)",
        "server.data_dir: changed; it takes a restart of yard",
        "server.listen: changed; it takes a restart of yard",
    ]
