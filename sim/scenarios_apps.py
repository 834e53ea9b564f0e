"""One app floods the queue (issue 14): per-app limits and weights keep the others'
waits where they were.

The studio's day from 09:00 to 15:00 on one 24 GiB GPU: the radio station's
newsroom (news scripts and voice-overs with start-by deadlines, priority 90/95),
the listeners' chat (priority 50), the show art (priority 40, deadlines), all as on
the radio day (:func:`sim.scenarios.radio_day_workload`, the same draws, times
moved to start at 0). Beside them a render app floods the image model: every
20 minutes from 00:10, :data:`WAVE` requests of priority 10 at one instant (what a
render tool does that sends its whole list and sends the refused part again on its
next round), some :data:`WAVE` x 18 renders over the six hours.

Variants (the draws are the same in each; a variant keeps its part):

- ``apps-calm-1gpu``: the day without the render app (the reference).
- ``apps-flood-1gpu``: the day with the flood, and the render app's limits as a
  studio would write them (:data:`RENDER_LIMITS`): ``max_queued = 10``,
  ``max_concurrent = 1``, ``weight = 0.25``.
- ``apps-flood-noweight-1gpu``: the flood with the same limits but no weight.
- ``apps-flood-open-1gpu``: the flood with no limits at all (what yard did before
  issue 14): every render waits in the queue and ages.

The target (``python -m sim targets``): on ``apps-flood-1gpu`` every other app's
p95 wait over the day is at most 1.2x its p95 on ``apps-calm-1gpu``. The day's
p95 of the chat and the newsroom is set by the breaking-news burst, so the table
also shows each app's worst hour, not judged: there the flood still shows (the
image model stays busy with renders, and the news and chat loads wait for its
drain or evict each other).
"""

from __future__ import annotations

import concurrent.futures
import math
import random
from collections.abc import Sequence
from dataclasses import replace

from sim.metrics import metrics, percentile
from sim.runner import SimResult, run
from sim.scenarios import HOUR, MINUTE, radio_day, radio_day_workload
from sim.scenarios import get as get_scenario
from sim.workload import AppLimits, Arrival, Scenario, lognormal, renumber

DAY_START = 9 * HOUR
"""The slice of the radio day the studio's day takes (09:00 on)."""
HOURS = 6.0
WAVE = 400
"""Renders sent at once in each wave."""
WAVE_EVERY_S = 20 * MINUTE
FIRST_WAVE_S = 10 * MINUTE
RENDER_SERVICE_S = 6.0
"""Mean seconds one render holds the image model."""

RENDER_LIMITS = AppLimits(
    max_queued={"render": 10},
    max_concurrent={"render": 1},
    weights={"render": 0.25},
)
VARIANTS: dict[str, tuple[bool, AppLimits | None]] = {
    "calm": (False, RENDER_LIMITS),
    "flood": (True, RENDER_LIMITS),
    "flood-noweight": (True, replace(RENDER_LIMITS, weights={})),
    "flood-open": (True, None),
}


def studio_workload(rng: random.Random, hours: float, flood: bool) -> list[Arrival]:
    """The radio day's requests from 09:00 for ``hours`` (moved to start at 0),
    plus the render waves when ``flood``. Both parts are drawn either way, so the
    other apps' requests are the same with and without the flood."""
    day = radio_day_workload(rng, 24.0)
    end = hours * HOUR
    out = [
        replace(
            a,
            at=a.at - DAY_START,
            start_by=None if a.start_by is None else a.start_by - DAY_START,
        )
        for a in day
        if DAY_START <= a.at < DAY_START + end
    ]
    renders = []
    wave = FIRST_WAVE_S
    while wave < end:
        for _ in range(WAVE):
            renders.append(
                Arrival(
                    at=wave,
                    request_id="",
                    backend="image",
                    priority=10.0,
                    service_s=lognormal(rng, RENDER_SERVICE_S, 0.3),
                    cls="low",
                    app="render",
                )
            )
        wave += WAVE_EVERY_S
    return renumber(out + renders if flood else out)


def apps_scenario(variant: str, hours: float = HOURS) -> Scenario:
    """``apps-VARIANT-1gpu`` (see the module docstring); ``hours`` < 6: a shorter
    slice from 09:00, for tests."""
    flood, limits = VARIANTS[variant]
    suffix = "" if hours == HOURS else f"-{hours:g}h"
    base = radio_day(1)
    return Scenario(
        name=f"apps-{variant}-1gpu{suffix}",
        title=f"the studio's day, {variant.replace('-', ', ')} (render app)",
        machine=base.machine,
        models=base.models,
        workload=lambda rng: studio_workload(rng, hours, flood),
        horizon_s=hours * HOUR + 2 * HOUR,
        stored_profiles=True,
        meter_interval_s=10.0,
        seed=2024,
        policies=("yard",),
        apps=limits,
    )


def get(name: str) -> Scenario | None:
    """``apps-VARIANT-1gpu`` or ``apps-VARIANT-1gpu-Hh``; None for other names."""
    if not name.startswith("apps-"):
        return None
    rest, _, hours = name.removeprefix("apps-").partition("-1gpu")
    if rest not in VARIANTS:
        return None
    return apps_scenario(rest, float(hours.removeprefix("-").removesuffix("h") or HOURS))


OTHERS = ("chat", "newsroom", "art")
"""The apps the flood must not slow down."""
TARGET_RATIO = 1.2


def flood_jobs(seeds: Sequence[int]) -> list[tuple[str, str, int]]:
    """(scenario, policy, seed) for the flood target: the calm day and the flood."""
    return [
        (apps_scenario(variant).name, "yard", seed)
        for seed in seeds
        for variant in ("calm", "flood")
    ]


def hourly_p95(result: SimResult) -> dict[str, float]:
    """``hour_H_APP_p95_s``: each other app's p95 wait among its requests that
    arrived in hour ``H`` of the day (0 = 09:00), for the hours it sent any."""
    waits: dict[tuple[int, str], list[float]] = {}
    for r in result.records:
        if r.dispatches and r.arrival.app in OTHERS:
            key = (int(r.arrival.at // HOUR), r.arrival.app)
            waits.setdefault(key, []).append(r.dispatches[0] - r.arrival.at)
    return {f"hour_{h}_{app}_p95_s": percentile(ws, 0.95) for (h, app), ws in waits.items()}


def _measure(job: tuple[str, str, int]) -> tuple[tuple[str, str, int], dict[str, float]]:
    name, policy, seed = job
    result = run(get_scenario(name), policy, seed)
    return job, metrics(result) | hourly_p95(result)


def _worst_hour(calm: dict[str, float], flood: dict[str, float], app: str) -> str:
    """The hour where ``app``'s p95 grew most, as ``HH:00 calm -> flood``."""
    worst: tuple[float, int] | None = None
    for h in range(int(HOURS)):
        key = f"hour_{h}_{app}_p95_s"
        if key in calm and key in flood:
            growth = flood[key] - calm[key]
            if worst is None or growth > worst[0]:
                worst = (growth, h)
    if worst is None:
        return "-"
    h = worst[1]
    key = f"hour_{h}_{app}_p95_s"
    return f"{9 + h:02d}:00 {calm[key]:.1f} -> {flood[key]:.1f} s"


def flood_table(seeds: Sequence[int], jobs: int) -> str:
    """The flood target, per seed and other app: p95 wait on the flood day against the
    calm day (at most :data:`TARGET_RATIO`), with the render app's figures beside."""
    todo = flood_jobs(seeds)
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        found = dict(pool.map(_measure, todo))
    lines = [
        "| seed | app | p95 wait, calm | p95 wait, flood | ratio (target <= 1.2) "
        "| worst hour's p95 (not judged) |",
        "|---|---|---|---|---|---|",
    ]
    for seed in seeds:
        calm = found[(apps_scenario("calm").name, "yard", seed)]
        flood = found[(apps_scenario("flood").name, "yard", seed)]
        for app in OTHERS:
            before = calm[f"app_{app}_wait_p95_s"]
            after = flood[f"app_{app}_wait_p95_s"]
            ratio = after / before if before else (1.0 if after == 0 else math.inf)
            mark = "ok" if ratio <= TARGET_RATIO else "MISSED"
            lines.append(
                f"| {seed} | {app} | {before:.1f} s | {after:.1f} s | {ratio:.2f} {mark} "
                f"| {_worst_hour(calm, flood, app)} |"
            )
        lines.append(
            f"| {seed} | render | - | {flood['app_render_wait_p95_s']:.1f} s | "
            f"{flood['app_render_requests']:.0f} sent, {flood['app_render_rejected']:.0f} "
            f"refused (max_queued), served {flood['app_render_served_s'] / 60:.0f} min | |"
        )
    return "\n".join(lines) + "\n"
