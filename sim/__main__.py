"""``python -m sim report [--json]`` and ``python -m sim bench``.

report: every report scenario under yard and each baseline, side by side (a table,
    or ``{scenario: {policy: {metric: value}}}`` with ``--json``).
targets: the radio day's targets (OOMs, deadlines, loads, waits, wall time) judged
    for each machine shape and seed; then the announced radio day's and the batch's
    (:mod:`sim.targets_ahead`), the flood's, and the two-host day's (:mod:`sim.cluster`).
slots: only the one-GPU announced radio day with news-llm's slot range, judged per
    seed (:func:`sim.targets_ahead.slots_table`; also in ``targets``).
cluster: the radio day on two one-GPU hosts sharing a simulated database (issue 13),
    beside the one-host days of the same seeds (:mod:`sim.cluster`).
bench: the core benchmark (``sim.bench_core.main()``, if present), then the wall
    time of the simulated radio day through the whole engine.
decisions: every scenario's decision log under yard, one file each, into ``--out``
    (see :mod:`sim.decisions`), to diff before and after a change of the core.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence

from sim import scenarios
from sim.metrics import apps_in, metrics
from sim.runner import POLICIES, run


def _measure(job: tuple[str, str, int | None]) -> tuple[str, str, dict[str, float]]:
    """Run one scenario under one policy (in a worker process) and return its metrics."""
    name, policy, seed = job
    return name, policy, metrics(run(scenarios.get(name), policy, seed))


def _report(args: argparse.Namespace) -> int:
    chosen = [scenarios.get(name) for name in args.scenario] or scenarios.report_scenarios()
    policies = args.policy or list(POLICIES)
    jobs = [
        (scenario.name, policy, args.seed)
        for scenario in chosen
        for policy in policies
        if scenario.policies is None or policy in scenario.policies
    ]
    # Runs are independent (each owns its seed), so they may run side by side; the
    # longest first, so that the pool ends together.
    jobs.sort(key=lambda job: not job[0].startswith("radio-day"))
    found: dict[tuple[str, str], dict[str, float]] = {}
    if args.jobs > 1:
        with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
            for name, policy, row in pool.map(_measure, jobs):
                found[(name, policy)] = row
    else:
        for job in jobs:
            name, policy, row = _measure(job)
            found[(name, policy)] = row
    results: dict[str, dict[str, dict[str, float]]] = {}
    for scenario in chosen:
        rows = {p: found[(scenario.name, p)] for p in policies if (scenario.name, p) in found}
        if not rows:
            # None of the chosen policies runs this scenario (the first day is yard's alone).
            continue
        results[scenario.name] = rows
        if not args.json:
            print(render_table(scenario.name, scenario.title, rows))
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


COLUMNS = (
    ("loads", "loads", "{:.0f}"),
    ("LB", "loads_lower_bound", "{:.0f}"),
    ("x LB", "", ""),
    ("OOMs", "ooms", "{:.0f}"),
    ("met", "deadlines_met", "{:.0f}"),
    ("missed", "deadlines_missed", "{:.0f}"),
    ("avoid.", "deadlines_missed_avoidable", "{:.0f}"),
    ("high p50/p95/max s", "high", ""),
    ("normal p50/p95/max s", "normal", ""),
    ("low p50/p95/max s", "low", ""),
    ("load %", "gpu_loading_share", "{:.1%}"),
    ("serve %", "gpu_serving_share", "{:.1%}"),
    ("idle+work %", "gpu_idle_with_work_share", "{:.1%}"),
    ("stuck", "stuck", "{:.0f}"),
    ("refused/failed", "rejected", "{:.0f}"),
)


def _cell(row: dict[str, float], key: str, fmt: str, header: str) -> str:
    if header == "x LB":
        bound = row["loads_lower_bound"]
        return f"{row['loads'] / bound:.2f}" if bound else "-"
    if key in ("high", "normal", "low"):
        return "/".join(
            f"{row[f'{key}_wait_{q}_s']:.0f}"
            if row[f"{key}_wait_{q}_s"] >= 10
            else f"{row[f'{key}_wait_{q}_s']:.1f}"
            for q in ("p50", "p95", "max")
        )
    return fmt.format(row[key])


def render_table(name: str, title: str, rows: dict[str, dict[str, float]]) -> str:
    """One scenario's results as a Markdown table (docs/simulation.md uses it too)."""
    headers = ["policy", *(h for h, _, _ in COLUMNS)]
    lines = [f"### {name}: {title}", ""]
    lines.append("| " + " | ".join(headers) + " |")
    lines.append("|" + "|".join("---" for _ in headers) + "|")
    for policy, row in rows.items():
        cells = [policy, *(_cell(row, key, fmt, h) for h, key, fmt in COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    requests = next(iter(rows.values()))["requests"]
    hours = ", ".join(f"{p} {row['sim_seconds'] / 3600:.1f} h" for p, row in rows.items())
    lines.append(f"{requests:.0f} requests; simulated time until the last one ended: {hours}.")
    return "\n".join(lines) + "\n" + render_apps(rows)


def render_apps(rows: dict[str, dict[str, float]]) -> str:
    """Per app, under each policy: requests, wait p50/p95 and served time (empty
    when the scenario's requests name no app)."""
    lines = []
    for policy, row in rows.items():
        cells = [
            f"{app} {row[f'app_{app}_requests']:.0f} req, wait "
            f"{row[f'app_{app}_wait_p50_s']:.1f}/{row[f'app_{app}_wait_p95_s']:.1f} s, "
            f"served {row[f'app_{app}_served_s'] / 3600:.2f} h"
            + (f", {row[f'app_{app}_rejected']:.0f} refused" if row[f"app_{app}_rejected"] else "")
            for app in apps_in(row)
        ]
        if cells:
            lines.append(f"- by app, {policy}: " + "; ".join(cells) + ".")
    return "\n" + "\n".join(lines) + "\n" if lines else ""


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def _targets(args: argparse.Namespace) -> int:
    """The radio day's targets, per machine shape and seed, measured and judged; then
    issue 12's (the announced radio day, the batch: :mod:`sim.targets_ahead`)."""
    from sim import targets_ahead

    jobs: list[tuple[str, str, int | None]] = [
        (scenarios.radio_day(gpus).name, policy, seed)
        for gpus in (1, 2)
        for seed in args.seed
        for policy in POLICIES
    ]
    jobs += targets_ahead.announced_jobs(args.seed) + targets_ahead.batch_jobs(args.seed)
    jobs += [job for job in targets_ahead.slots_jobs(args.seed) if job not in jobs]
    found = targets_ahead.measure_all(jobs, max(1, args.jobs))
    print(
        "| machine | seed | OOMs | feasible deadlines met | loads vs baselines | loads / LB "
        "| high p95 vs best baseline | requests in wall |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for gpus in (1, 2):
        name = scenarios.radio_day(gpus).name
        for seed in args.seed:
            yard = found[(name, "yard", seed)]
            others = {p: found[(name, p, seed)] for p in POLICIES if p != "yard"}
            feasible = yard["deadlines_met"] + yard["deadlines_missed_avoidable"]
            fewest = min(row["loads"] for row in others.values())
            best = min(others.items(), key=lambda item: targets_ahead.high_p95(item[1]))
            ratio = yard["loads"] / yard["loads_lower_bound"]

            cells = [
                f"{gpus} GPU",
                str(seed),
                f"{yard['ooms']:.0f} {_mark(yard['ooms'] == 0)}",
                f"{yard['deadlines_met']:.0f}/{feasible:.0f} "
                f"{_mark(yard['deadlines_missed_avoidable'] == 0)}",
                f"{yard['loads']:.0f} vs {fewest:.0f} {_mark(yard['loads'] < fewest)}",
                f"{ratio:.2f} {_mark(ratio <= 1.2)}",
                f"{targets_ahead.high_p95(yard):.0f} s vs "
                f"{targets_ahead.high_p95(best[1]):.0f} s ({best[0]}) "
                f"{_mark(targets_ahead.high_p95(yard) <= targets_ahead.high_p95(best[1]) / 2)}",
                f"{yard['requests']:.0f} in {yard['wall_s']:.0f} s "
                f"{_mark(yard['requests'] >= 50_000 and yard['wall_s'] < 60)}",
            ]
            print("| " + " | ".join(cells) + " |")
    print("\nRadio day with the newsroom's announcements (yard; baselines: the plain day):\n")
    print(targets_ahead.announced_table(args.seed, found))
    print(_SLOTS_TITLE)
    print(targets_ahead.slots_table(args.seed, found))
    print("Batch: 1,000 lines over three models (3h window) while chat runs (yard):\n")
    print(targets_ahead.batch_table(args.seed, found))
    from sim import scenarios_apps

    print("One app floods the queue (render, 400 at once every 20 min) (yard):\n")
    print(scenarios_apps.flood_table(args.seed, max(1, args.jobs)))
    from sim import cluster

    print("Two hosts with one GPU each, one shared queue (issue 13; yard):\n")
    one_host = {
        (machine, seed): found[(scenarios.radio_day(gpus).name, "yard", seed)]
        for machine, gpus in ((cluster.MACHINES[0], 1), (cluster.MACHINES[1], 2))
        for seed in args.seed
    }
    print(cluster.table(args.seed, jobs=max(1, args.jobs), known=one_host))
    return 0


def _cluster(args: argparse.Namespace) -> int:
    from sim import cluster

    seeds = args.seed or [scenarios.radio_day(1).seed]
    hours = f"{args.hours:g} h" if args.hours != 24.0 else "day"
    print(f"Radio {hours}: one host and two hosts sharing one queue (yard):\n")
    print(cluster.table(seeds, args.hours, max(1, args.jobs)))
    return 0


def _bench(args: argparse.Namespace) -> int:
    try:
        bench_core = importlib.import_module("sim.bench_core")
    except ModuleNotFoundError:
        print("core benchmark: sim/bench_core.py is not there; skipped")
    else:
        bench_core.main()
    for gpus in (1, 2):
        scenario = scenarios.radio_day(gpus)
        result = run(scenario, "yard")
        print(
            f"radio day ({gpus} GPU): {len(result.records)} requests, "
            f"{result.end_time / 3600:.1f} simulated hours, {result.wall_s:.1f} s wall "
            f"({len(result.records) / result.wall_s:,.0f} requests/s), "
            f"{result.statistics.events} events, {result.statistics.decisions} decisions"
        )
    return 0


_SLOTS_TITLE = (
    "Radio day on one GPU with news-llm's slots (parallel = { min = 1, max = 2 }; yard "
    "announced; baselines: the plain day with the same slots as a fixed -np 2):\n"
)


def _slots(args: argparse.Namespace) -> int:
    """Only the one-GPU announced day with news-llm's slot range, judged per seed."""
    from sim import targets_ahead

    jobs = targets_ahead.slots_jobs(args.seed)
    found = targets_ahead.measure_all(jobs, max(1, args.jobs))
    print(_SLOTS_TITLE)
    print(targets_ahead.slots_table(args.seed, found))
    return 0


def _decisions(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sim.decisions import write_all

    for name, lines, digest in write_all(Path(args.out), args.jobs):
        print(f"{name}: {lines} decisions, sha256 {digest[:16]}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="every scenario under every policy")
    report.add_argument("--json", action="store_true", help="print JSON instead of tables")
    report.add_argument(
        "--scenario", action="append", default=[], help="only this scenario (repeatable)"
    )
    report.add_argument(
        "--policy", action="append", choices=POLICIES, help="only this policy (repeatable)"
    )
    report.add_argument("--seed", type=int, default=None, help="instead of each scenario's own")
    report.add_argument(
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="simulations run side by side (default: the CPUs, at most 4)",
    )
    targets = commands.add_parser("targets", help="the radio day's targets, judged per seed")
    targets.add_argument(
        "--seed", type=int, action="append", default=None, help="a seed (repeatable)"
    )
    targets.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    slots_cmd = commands.add_parser(
        "slots", help="only the one-GPU announced radio day with news-llm's slots, per seed"
    )
    slots_cmd.add_argument(
        "--seed", type=int, action="append", default=None, help="a seed (repeatable)"
    )
    slots_cmd.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    cluster_cmd = commands.add_parser(
        "cluster", help="the radio day on two hosts sharing a queue, beside one host"
    )
    cluster_cmd.add_argument(
        "--seed", type=int, action="append", default=None, help="a seed (repeatable)"
    )
    cluster_cmd.add_argument(
        "--hours", type=float, default=24.0, help="hours from midnight (default: the day)"
    )
    cluster_cmd.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    commands.add_parser("bench", help="the core benchmark and the radio day's wall time")
    decisions = commands.add_parser("decisions", help="every scenario's decision log, to files")
    decisions.add_argument("--out", required=True, help="the folder to write the logs into")
    decisions.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument(
        "--verbose", action="store_true", help="show the engine's log (raised profiles, ...)"
    )
    args = parser.parse_args(argv)
    yard_log = logging.getLogger("yard")
    level = yard_log.level
    if not args.verbose:
        # The engine logs what a person running yard should see (a profile raised after
        # an out-of-memory); in a report of thousands of simulated days it is noise.
        yard_log.setLevel(logging.ERROR)
    try:
        if args.command == "report":
            return _report(args)
        if args.command == "decisions":
            return _decisions(args)
        if args.command == "cluster":
            return _cluster(args)
        if args.command == "targets":
            args.seed = args.seed or [scenarios.radio_day(1).seed]
            return _targets(args)
        if args.command == "slots":
            args.seed = args.seed or [scenarios.radio_day(1).seed]
            return _slots(args)
        return _bench(args)
    finally:
        yard_log.setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
