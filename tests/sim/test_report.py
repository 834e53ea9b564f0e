"""``python -m sim report --json``: the shape other tools read."""

from __future__ import annotations

import json

import pytest

from sim.__main__ import main

METRICS = (
    "loads",
    "loads_lower_bound",
    "ooms",
    "deadlines_met",
    "deadlines_missed",
    "deadlines_missed_avoidable",
    "wait_p50_s",
    "wait_p95_s",
    "wait_max_s",
    "high_wait_p95_s",
    "normal_wait_p50_s",
    "low_wait_max_s",
    "gpu_loading_share",
    "gpu_idle_with_work_share",
)


def test_report_json_gives_every_metric_per_scenario_and_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["report", "--json", "--scenario", "ten-jobs", "--jobs", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report) == ["ten-jobs"]
    assert list(report["ten-jobs"]) == [
        "yard",
        "llama-swap",
        "ollama",
        "llama.cpp-router",
        "localai",
    ]
    for row in report["ten-jobs"].values():
        assert set(METRICS) <= set(row)
    yard = report["ten-jobs"]["yard"]
    assert (yard["loads"], yard["deadlines_met"], yard["ooms"]) == (3, 1, 0)


def test_report_table_names_the_scenario_and_each_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["report", "--scenario", "ten-jobs", "--policy", "yard", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### ten-jobs: ten jobs, three models, one deadline")
    assert "| yard | 3 | 3 | 1.00 | 0 | 1 | 0 | 0 |" in out


def test_report_skips_a_scenario_that_none_of_the_chosen_policies_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The first day is yard's alone: asking for a baseline there prints nothing for
    # it, instead of failing on an empty table.
    argv = [
        "report",
        "--scenario",
        "radio-day-1gpu-first-day",
        "--policy",
        "localai",
        "--jobs",
        "1",
    ]
    assert main(argv) == 0
    assert "radio-day-1gpu-first-day" not in capsys.readouterr().out
