"""The compiled core (yard.compiled): used only when built from the sources on
disk, and deciding exactly as the plain-Python core does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import yard.core.scheduler
from yard import compiled

CASES = ("ten-jobs:1", "chaos-1:1", "chaos-2:2", "sweep-2.0x:1", "faults-oom-overcommit:1")
"""Scenarios (name:seed) whose decision logs both cores must write alike."""

DIGESTS = """
import sys
from sim import scenarios
from sim.runner import run
from yard import compiled
print(compiled.ACTIVE[0])
for case in sys.argv[1:]:
    name, seed = case.split(":")
    result = run(scenarios.get(name), "yard", int(seed), keep_log=True)
    print(case, len(result.log or ()), result.log_digest)
"""


def _fake_build(where: Path, stamp: str) -> Path:
    (where / "yard" / "core").mkdir(parents=True)
    (where / compiled.DIGEST).write_text(stamp + "\n")
    return where


def test_plain_python_runs_when_nothing_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(compiled.ENV, raising=False)
    ok, why = compiled.state(tmp_path / "nothing")
    assert not ok and "not compiled" in why and "yard.build_core" in why


def test_a_build_of_other_sources_is_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(compiled.ENV, raising=False)
    build = _fake_build(tmp_path, "0" * 64)
    ok, why = compiled.state(build)
    assert not ok and "other sources" in why


def test_a_build_of_these_sources_is_used_unless_yard_core_says_pure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = _fake_build(tmp_path, compiled.digest(compiled.sources()))
    monkeypatch.delenv(compiled.ENV, raising=False)
    assert compiled.state(build)[0]
    monkeypatch.setenv(compiled.ENV, "pure")
    ok, why = compiled.state(build)
    assert not ok and "YARD_CORE=pure" in why


def test_a_build_that_does_not_load_leaves_the_plain_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(compiled.ENV, raising=False)
    build = _fake_build(tmp_path, compiled.digest(compiled.sources()))
    for p in compiled.sources():  # every module "built", but as files that are no library
        (build / "yard" / "core" / f"{p.stem}{compiled.SUFFIX}").write_bytes(b"not a library")
    (build / "yard" / f"core__mypyc{compiled.SUFFIX}").write_bytes(b"not a library")
    monkeypatch.delitem(sys.modules, "yard.core.scheduler")  # as if yard were starting
    monkeypatch.delitem(sys.modules, f"{compiled.GROUP}__mypyc", raising=False)
    before = list(sys.meta_path)
    saved = compiled.ACTIVE
    try:
        ok, why = compiled.use(build)
    finally:
        compiled.ACTIVE = saved
    assert not ok and "does not load" in why
    assert sys.meta_path == before


def test_the_digest_changes_with_any_byte_of_the_core(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    before = compiled.digest([a, b])
    a.write_text("x = 2\n")
    assert compiled.digest([a, b]) != before


def test_the_core_in_use_is_the_one_yard_says(tmp_path: Path) -> None:
    ok, _ = compiled.ACTIVE
    file = yard.core.scheduler.__file__ or ""
    assert file.endswith(compiled.SUFFIX) == ok
    if os.environ.get(compiled.ENV) == "pure":
        assert not ok


@pytest.mark.slow
def test_the_compiled_core_decides_exactly_as_the_plain_one() -> None:
    if not compiled.ACTIVE[0]:
        pytest.skip(f"the compiled core is not in use here: {compiled.ACTIVE[1]}")
    logs = []
    for core in ("compiled", "pure"):
        env = {**os.environ, compiled.ENV: core}
        out = subprocess.run(
            [sys.executable, "-c", DIGESTS, *CASES],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout.splitlines()
        logs.append(out)
    compiled_log, pure_log = logs
    assert compiled_log[0] == "True" and pure_log[0] == "False"
    assert len(compiled_log) == len(CASES) + 1
    assert compiled_log[1:] == pure_log[1:]
