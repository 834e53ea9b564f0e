"""Shared set-up of the memory tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from yard.memory.gpus import record_layout, recorded_layout


@pytest.fixture(autouse=True)
def _forget_the_gpu_layout() -> Iterator[None]:
    """``default_meter`` records the machine's GPU layout for the supervisor;
    a test's made-up machine must not outlive the test."""
    before = recorded_layout()
    yield
    record_layout(before)
