"""The core benchmark's split by event type (sim.bench_core.by_kind)."""

from __future__ import annotations

import pytest

from sim.bench_core import by_kind


def test_the_split_by_event_type_puts_the_costliest_type_first_and_counts_its_tail() -> None:
    cpu = [10.0] * 90 + [20.0] * 8 + [1_000.0, 2_000.0]
    kinds = ["Tick"] * 90 + ["RequestArrived"] * 8 + ["BackendReady"] * 2
    rows = by_kind(cpu, kinds)
    assert [row[0] for row in rows] == ["BackendReady", "Tick", "RequestArrived"]
    ready = rows[0]
    assert ready[1:4] == (2, 1_500.0, 1_500.0)
    assert ready[4] == pytest.approx(3_000.0 / sum(cpu))
    assert ready[5] == 1  # only the 2,000 us one is above the p99 of all
    assert ready[6] == 0.0  # none of them under the 50 us the median must be under
    assert rows[1][6] == 1.0 and rows[2][6] == 1.0
    assert sum(row[1] for row in rows) == len(cpu)
