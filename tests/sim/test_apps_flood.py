"""One app floods the queue (issue 14), in the simulation: the render app's limits and
weight keep the other apps' waits where they were on the calm day, on a short
slice of the studio's day (sim/scenarios_apps.py)."""

from __future__ import annotations

import functools
import itertools
import random

from sim import scenarios
from sim.metrics import app_metrics, apps_in, metrics
from sim.runner import SimResult, run
from sim.scenarios_apps import OTHERS, TARGET_RATIO, WAVE, apps_scenario, studio_workload

SLICE_H = 0.5
"""Half an hour from 09:00: one wave of renders, at 00:10."""


@functools.cache
def _run(variant: str) -> SimResult:
    return run(apps_scenario(variant, SLICE_H), "yard")


def test_the_other_apps_requests_are_the_same_with_and_without_the_flood() -> None:
    def others(flood: bool) -> list[tuple[float, str, float, str, float]]:
        arrivals = studio_workload(random.Random(2024), SLICE_H, flood)
        return [
            (a.at, a.backend, a.priority, a.app, a.service_s) for a in arrivals if a.app != "render"
        ]

    assert others(True) == others(False)
    flood = studio_workload(random.Random(2024), SLICE_H, True)
    assert sum(a.app == "render" for a in flood) == WAVE
    assert scenarios.get("apps-flood-1gpu-0.5h").name == "apps-flood-1gpu-0.5h"


def test_a_flood_of_renders_leaves_the_other_apps_waits_as_on_the_calm_day() -> None:
    calm, flood = _run("calm"), _run("flood")
    assert not calm.stuck and not flood.stuck
    before, after = metrics(calm), metrics(flood)
    for app in OTHERS:
        if f"app_{app}_requests" in before:
            p95 = before[f"app_{app}_wait_p95_s"]
            assert after[f"app_{app}_wait_p95_s"] <= TARGET_RATIO * p95, app
    # The render app was held to its limits: refused at the door past max_queued
    # (10 waiting), never two renders served at once.
    render = [r for r in flood.records if r.arrival.app == "render"]
    refused = [r for r in render if r.outcome == "rejected"]
    assert refused and {r.code for r in refused} == {"app_queue_full"}
    assert len(render) - len(refused) <= 10 + 1
    spans = sorted((r.dispatches[0], r.ended_at) for r in render if r.dispatches)
    assert spans
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end is not None and start >= end


def test_the_report_has_waits_and_served_time_by_app() -> None:
    result = _run("flood")
    row = app_metrics(result.records)
    assert apps_in(row) == ["art", "chat", "render"]  # no news before 09:30
    render = [r for r in result.records if r.arrival.app == "render"]
    served = sum(r.arrival.service_s for r in render if r.outcome == "ok")
    assert row["app_render_served_s"] == round(served, 3)
    assert row["app_render_requests"] == len(render)
    waits = sorted(r.dispatches[0] - r.arrival.at for r in render if r.dispatches)
    assert row["app_render_wait_max_s"] == round(waits[-1], 3)
