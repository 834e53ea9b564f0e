"""scripts/nvml_check.py runs everywhere: a real check on a GPU, a clean exit without."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "nvml_check.py"


@pytest.mark.slow
def test_nvml_check_exits_cleanly_and_says_what_it_found() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--bytes", "256MiB"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    if first.startswith("host-only mode"):
        assert "no GPU here: nothing to check" in done.stdout
    else:
        assert first.startswith("GPUs metered through NVML")
