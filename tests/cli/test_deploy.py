"""docs/deploy.md's systemd unit is one systemd accepts (``systemd-analyze
verify``, where the tool exists)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def _unit() -> str:
    blocks: list[str] = re.findall(r"```ini\n(.*?)```", DEPLOY.read_text(), re.DOTALL)
    [unit] = [b for b in blocks if "/etc/systemd/system/yard.service" in b]
    return unit


def test_the_unit_reloads_with_sighup_and_stops_with_sigterm() -> None:
    unit = _unit()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit
    assert "KillSignal=SIGTERM" in unit and "KillMode=mixed" in unit


def _verify(unit: str, where: Path) -> list[str]:
    """What ``systemd-analyze verify`` says about ``unit`` (it exits 0 for a
    key it ignores, so its lines are read)."""
    # The program where this machine has one.
    yard = where / "yard"
    yard.write_text(f"#!{sys.executable}\n")
    yard.chmod(0o755)
    path = where / "yard.service"
    path.write_text(unit.replace("/opt/yard/bin/yard", str(yard)))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = (done.stdout + done.stderr).splitlines()
    problems = [line for line in said if "yard.service" in line]
    return problems if done.returncode == 0 else [*problems, f"exit {done.returncode}"]


needs_systemd = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="no systemd-analyze here"
)


@needs_systemd
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    assert _verify(_unit(), tmp_path) == []


@needs_systemd
def test_the_check_sees_a_mistake_systemd_would_ignore(tmp_path: Path) -> None:
    broken = _unit().replace("KillMode=mixed", "KillMode=gently")
    [problem] = _verify(broken, tmp_path)
    assert "kill mode" in problem
