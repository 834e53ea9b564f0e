"""yard probe on a backend with a context range: measured at both ends, the line stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from yard.cli import main


@pytest.mark.slow
def test_a_context_range_is_probed_at_min_and_max_and_its_line_stored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "llama-server.py"
    script.write_text((Path(__file__).parent / "fake_llama.py").read_text())
    record = tmp_path / "ranged.txt"
    command = ["{python}", str(script), "{port}", str(record), "ok", "-c", "{context}"]
    config = tmp_path / "yard.toml"
    config.write_text(
        '[server]\ndata_dir = "data"\nstop_grace_s = 2\n\n'
        f'[backends.ranged]\nmodels = ["m"]\ncommand = {json.dumps(command)}\n'
        "context = { min = 16, max = 64 }\n"
    )
    args = ["probe", "ranged", "--config", str(config), "--json", "--settle", "0"]
    assert main([*args, "--timeout", "60"]) == 0
    report = json.loads(capsys.readouterr().out)
    line = report["context"]
    assert set(line["points"]) == {"16", "64"}
    assert line["host_per_token"] is not None and line["host_per_token"] >= 0
    log = (tmp_path / "data" / "logs" / "ranged.log").read_text()
    assert "'-c', '16'" in log and "'-c', '64'" in log
    assert record.read_text().splitlines().count("completion of 56 tokens") == 2
