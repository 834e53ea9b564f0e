"""Every scenario's decision log under yard, written to files, for before/after diffs.

``python -m sim decisions --out DIR`` runs each scenario of :func:`cases` (every
report scenario at its own seed and two more, every fault kind, the chaos seeds of
the tests, the radio day on one and two GPUs) under ``yard`` and writes
``DIR/<scenario>-seed<N>.log``: one line per decision, ``<time> <repr>``, exactly
what the runner hashes into ``log_digest``. A refactor of the core that changes no
decision leaves every file byte-identical (``diff -r BEFORE AFTER``).
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

from sim import scenarios
from sim.runner import run

FAULT_KINDS = (
    "crash-while-loading",
    "crash-while-serving",
    "oom-overcommit",
    "hang",
    "slow-start",
    "foreign-memory",
    "client-cancels",
)
CHAOS_SEEDS = tuple(range(1, 13))
EXTRA_SEEDS = (1, 2)


def cases() -> list[tuple[str, int]]:
    """(scenario name, seed) for every log written, the longest first."""
    out: list[tuple[str, int]] = []
    for scenario in scenarios.report_scenarios():
        seeds = (scenario.seed, *(s for s in EXTRA_SEEDS if s != scenario.seed))
        out.extend((scenario.name, s) for s in seeds)
    for kind in FAULT_KINDS:
        scenario = scenarios.fault_scenario(kind)
        seeds = (scenario.seed, *(s for s in EXTRA_SEEDS if s != scenario.seed))
        out.extend((scenario.name, s) for s in seeds)
    out.extend((f"chaos-{seed}", seed) for seed in CHAOS_SEEDS)
    out.sort(key=lambda case: not case[0].startswith("radio-day"))
    return out


def write_one(case: tuple[str, int], out_dir: str) -> tuple[str, int, str]:
    """Run one case and write its log; returns (name, lines, digest)."""
    name, seed = case
    result = run(scenarios.get(name), "yard", seed, keep_log=True)
    assert result.log is not None
    path = Path(out_dir) / f"{name}-seed{seed}.log"
    path.write_text("".join(result.log))
    return path.name, len(result.log), result.log_digest


def write_all(out_dir: Path, jobs: int) -> list[tuple[str, int, str]]:
    """Write every case's log into ``out_dir`` (created); ``jobs`` runs side by side."""
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = cases()
    if jobs <= 1:
        return [write_one(case, str(out_dir)) for case in todo]
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(write_one, todo, [str(out_dir)] * len(todo)))
