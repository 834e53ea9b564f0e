"""``yard probe`` end to end, with the real supervisor and the test backend."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest
import trio

from yard.cli import main
from yard.config import load_config
from yard.memory.probe import live_yard
from yard.memory.profiles import open_profile_store

MIB = 1 << 20


def write_config(root: Path, *, extra: str = "") -> Path:
    path = root / "yard.toml"
    path.write_text(
        """
[server]
data_dir = "data"

[backends.tb]
models = ["tb-model"]
command = ["{python}", "-m", "yard.testing.backend", "--port", "{port}", "--load-time", "0.3",
           "--memory", "64MiB", "--grow-after-first", "32MiB", "--model", "tb-model"]

[backends.tb.warmup]
method = "POST"
path = "/v1/chat/completions"
json = { model = "tb-model", messages = [{ role = "user", content = "hi" }] }

[backends.pin]
models = ["pin-model"]
pinned = true
command = ["{python}", "-m", "yard.testing.backend", "--port", "{port}", "--memory", "16MiB"]

[backends.dies]
models = ["dies"]
command = ["{python}", "-m", "yard.testing.backend", "--port", "{port}", "--oom"]
"""
        + extra
    )
    return path


@pytest.mark.slow
def test_probe_measures_the_warm_up_peak_and_stores_the_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = write_config(tmp_path)
    assert main(["probe", "pin-model", "--config", str(config_path), "--json"]) == 0
    capsys.readouterr()
    args = ["--json", "--settle", "0.3", "--timeout", "60"]
    rc = main(["probe", "tb-model", "--config", str(config_path), *args])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    host = report["devices"]["host"]
    # An interpreter (~20 MiB) + 64 MiB at load + 32 MiB on the warm-up request.
    assert 96 * MIB < host["peak_bytes"] < 96 * MIB + 48 * MIB
    assert host["reservation_bytes"] == int(host["peak_bytes"] * 1.1)
    assert host["attribution"] == "process-tree"
    assert 0.3 <= report["load_s"] < 30
    (fit,) = report["fits"]
    assert fit["device"] == "host" and fit["fits"] is True
    assert fit["pinned"] == ["pin"]
    assert report["pinned_without_profile"] == []
    assert report["stored"] is True

    async def stored() -> tuple[int, int | None]:
        store = await open_profile_store(load_config(config_path))
        try:
            record = await store.record("tb")
            assert record is not None
            return record.profile.host_bytes, record.steady_host_bytes
        finally:
            await store.aclose()

    assert trio.run(stored) == (host["peak_bytes"], host["steady_bytes"])


@pytest.mark.slow
def test_probe_reports_a_backend_that_dies_while_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["probe", "dies", "--config", str(write_config(tmp_path)), "--timeout", "60"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "dies failed" in err
    assert "out of memory" in err


def test_probe_refuses_an_unknown_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "nope", "--config", str(write_config(tmp_path))]) == 2
    assert "'nope' is neither a model nor a backend" in capsys.readouterr().err


def test_probe_refuses_to_share_a_data_dir_with_a_running_yard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = write_config(tmp_path)
    run_dir = tmp_path / "data" / "run"
    run_dir.mkdir(parents=True)
    me = os.getpid()
    # This test process plays both the yard and its backend.
    record = {"backend": "tb", "pid": me, "start_time": psutil.Process(me).create_time()}
    (run_dir / "tb.pid").write_text(json.dumps({**record, "yard_pid": me}))
    assert live_yard(tmp_path / "data") is not None
    assert main(["probe", "tb-model", "--config", str(config_path)]) == 3
    assert "a running yard uses" in capsys.readouterr().err
    # A pid file left by a yard that is gone (its pid's start time differs) is no obstacle.
    (run_dir / "tb.pid").write_text(json.dumps({**record, "start_time": 1.0, "yard_pid": me}))
    assert live_yard(tmp_path / "data") is None
