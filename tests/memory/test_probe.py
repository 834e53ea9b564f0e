"""``yard probe`` end to end, with the real supervisor and the test backend."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest
import trio

from yard import datadir
from yard.cli import main
from yard.config import load_config
from yard.memory.profiles import open_profile_store

MIB = 1 << 20


def live_yard(data_dir: Path) -> str | None:
    """A sentence naming a backend that a running yard started from
    ``data_dir``, or None. (The supervisor's pid files say who started what.)"""
    for path in sorted((data_dir / "run").glob("*.pid")):
        try:
            record = json.loads(path.read_text())
            pid, started = int(record["pid"]), float(record["start_time"])
            owner = int(record.get("yard_pid", 0))
            alive = abs(psutil.Process(pid).create_time() - started) < 0.05
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            continue
        if alive and owner and psutil.pid_exists(owner):
            return f"{record.get('backend', path.stem)} (pid {pid}) of the yard with pid {owner}"
    return None


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


def test_probe_refuses_a_data_dir_that_a_running_yard_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = write_config(tmp_path)
    # This test process plays the running yard: it holds the data directory.
    with datadir.hold(tmp_path / "data", command="yard serve", listen="127.0.0.1:8123"):
        assert main(["probe", "tb-model", "--config", str(config_path)]) == 3
    err = capsys.readouterr().err
    assert f"yard serve (pid {os.getpid()}, listening on 127.0.0.1:8123)" in err
    assert not list((tmp_path / "data" / "run").glob("*.pid"))  # nothing was started


def test_live_yard_names_a_backend_whose_yard_still_runs(tmp_path: Path) -> None:
    run_dir = tmp_path / "data" / "run"
    run_dir.mkdir(parents=True)
    me = os.getpid()
    # This test process plays both the yard and its backend.
    record = {"backend": "tb", "pid": me, "start_time": psutil.Process(me).create_time()}
    (run_dir / "tb.pid").write_text(json.dumps({**record, "yard_pid": me}))
    assert live_yard(tmp_path / "data") is not None
    # A pid file left by a yard that is gone (its pid's start time differs) is no obstacle.
    (run_dir / "tb.pid").write_text(json.dumps({**record, "start_time": 1.0, "yard_pid": me}))
    assert live_yard(tmp_path / "data") is None


def fill_config(root: Path) -> Path:
    """Backends on the fake llama-server (tests/memory/fake_llama.py), copied
    under a llama-server name and a plain one; each records what reached it."""
    source = (Path(__file__).parent / "fake_llama.py").read_text()
    scripts = {"llama": root / "llama-server.py", "plain": root / "plain-server.py"}
    for path in scripts.values():
        path.write_text(source)
    blocks = ['[server]\ndata_dir = "data"\nstop_grace_s = 2\n']
    for name, kind, fill, mode in [
        ("auto", "llama", None, "ok"),
        ("off", "llama", "false", "ok"),
        ("forced", "plain", "true", "ok"),
        ("plain", "plain", None, "ok"),
        ("broken", "plain", "true", "no-props"),
    ]:
        command = ["{python}", str(scripts[kind]), "{port}", str(root / f"{name}.txt"), mode]
        blocks.append(
            f'[backends.{name}]\nmodels = ["{name}"]\ncommand = {json.dumps(command)}\n'
            f'[backends.{name}.warmup]\npath = "/v1/completions"\njson = {{ prompt = "hi" }}\n'
            + (f"fill_context = {fill}\n" if fill is not None else "")
        )
    config = root / "yard.toml"
    config.write_text("\n".join(blocks))
    return config


def probe_requests(
    root: Path, config: Path, backend: str, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[list[str], dict[str, object]]:
    """Probe ``backend``; the requests that reached it, and the JSON report."""
    record = root / f"{backend}.txt"
    record.unlink(missing_ok=True)
    args = ["--json", "--settle", "0", "--timeout", "60", "--no-store", *extra]
    assert main(["probe", backend, "--config", str(config), *args]) == 0
    report = json.loads(capsys.readouterr().out)
    return record.read_text().splitlines(), report


@pytest.mark.slow
def test_probe_fills_the_context_as_each_backends_fill_context_says_and_only_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = fill_config(tmp_path)
    warm_up, fill = "warm-up /v1/completions", "completion of 56 tokens"  # n_ctx 64 less 8
    # "auto" on llama-server: the configured warm-up, then one fill (the probe's,
    # not a second one by the supervisor).
    seen, report = probe_requests(tmp_path, config, "auto", capsys)
    assert seen == [warm_up, fill]
    assert report["warmup_s"] is not None
    seen, report = probe_requests(tmp_path, config, "off", capsys)
    assert seen == [warm_up]
    assert report["warmup_s"] is None
    # true fills whatever the command looks like; "auto" fills only llama-server.
    assert probe_requests(tmp_path, config, "forced", capsys)[0] == [warm_up, fill]
    assert probe_requests(tmp_path, config, "plain", capsys)[0] == [warm_up]
    # --no-fill wins over the config.
    assert probe_requests(tmp_path, config, "forced", capsys, "--no-fill")[0] == [warm_up]
    assert probe_requests(tmp_path, config, "auto", capsys, "--no-fill")[0] == [warm_up]


@pytest.mark.slow
def test_a_failed_context_fill_fails_the_probe_and_says_how_to_skip_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = fill_config(tmp_path)
    assert main(["probe", "broken", "--config", str(config), "--timeout", "60"]) == 1
    err = capsys.readouterr().err
    assert "broken failed: the context fill failed" in err
    assert "warmup.fill_context = false" in err and "--no-fill" in err
    assert (tmp_path / "broken.txt").read_text().splitlines() == ["warm-up /v1/completions"]
    assert live_yard(tmp_path / "data") is None  # the backend was stopped
