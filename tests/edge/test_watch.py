"""The /healthz watch of the bad-input suite blames yard for yard's stalls
only: a pause of the test process is not one, a stopped yard is."""

from __future__ import annotations

import ctypes
import os
import signal
import time

import pytest

from tests.edge.harness import HEALTHZ_CAP_S, Yard, healthz_answers

pytestmark = pytest.mark.slow


def _hold_the_gil(seconds: float) -> None:
    """Keep every other thread of this process off the interpreter, as
    building a 60 MiB request does on a loaded machine: a C call through
    ctypes.PyDLL keeps the GIL while it runs."""
    ctypes.PyDLL(None).usleep(int(seconds * 1_000_000))


def test_a_pause_of_the_test_process_is_not_blamed_on_yard(keyless: Yard) -> None:
    with healthz_answers(keyless) as watch:
        _hold_the_gil(1.0)
    assert len(watch.latencies) >= 3
    assert max(watch.latencies) < HEALTHZ_CAP_S, watch.latencies


def test_a_stopped_yard_fails_the_watch(keyless: Yard) -> None:
    with (
        pytest.raises(AssertionError, match="/healthz failed during the attack"),
        healthz_answers(keyless),
    ):
        os.kill(keyless.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(2 * HEALTHZ_CAP_S)
        finally:
            os.kill(keyless.proc.pid, signal.SIGCONT)
