"""yard probe on a backend with context and parallel ranges: measured at the
ends of the path starts are chosen on, both lines stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from yard.cli import main


@pytest.mark.slow
def test_both_ranges_are_probed_along_the_path_and_their_lines_stored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "llama-server.py"
    script.write_text((Path(__file__).parent / "fake_llama.py").read_text())
    record = tmp_path / "ranged.txt"
    command = [
        *("{python}", str(script), "{port}", str(record), "ok"),
        *("-c", "{total_context}", "-np", "{parallel}"),
    ]
    config = tmp_path / "yard.toml"
    config.write_text(
        '[server]\ndata_dir = "data"\nstop_grace_s = 2\n\n'
        f'[backends.ranged]\nmodels = ["m"]\ncommand = {json.dumps(command)}\n'
        "context = { min = 16, max = 64 }\nparallel = { min = 1, max = 2 }\n"
    )
    args = ["probe", "ranged", "--config", str(config), "--json", "--settle", "0"]
    assert main([*args, "--timeout", "60"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["context"]["points"]) == {"16", "64"}
    slots = report["parallel"]
    assert (slots["context"], set(slots["points"])) == (64, {"1", "2"})
    assert slots["host_per_slot"] is not None and slots["host_per_slot"] >= 0
    log = (tmp_path / "data" / "logs" / "ranged.log").read_text()
    for total, parallel in (("16", "1"), ("64", "1"), ("128", "2")):
        assert f"'-c', '{total}', '-np', '{parallel}'" in log
