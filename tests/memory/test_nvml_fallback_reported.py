"""NVML falling back to device deltas while yard runs is reported: the reading
says so, the engine logs it once and tells the core, and the core then measures
first loads on that GPU alone, as on a GPU that never had per-process figures."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from tests.core.harness import Harness, gpu, host
from tests.memory.fake_proc import FakeProc
from yard.core import BackendSpec, Flag, MemoryMeasured, StartBackend, StopBackend
from yard.core.events import Event
from yard.engine.metering import Metering
from yard.memory import NvmlMeter, open_nvml
from yard.ports import DeviceReading
from yard.testing.gpu import (
    GIB,
    NVML_ERROR_NO_PERMISSION,
    FakeGpu,
    FakeNvml,
    ProcessInfo,
)


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    fake = FakeProc(tmp_path / "proc")
    fake.add(100, anon_kib=1000)  # known's root
    return fake


def gpu0(readings: list[DeviceReading]) -> DeviceReading:
    return next(r for r in readings if r.device == "gpu0")


def test_a_reading_says_when_the_gpu_fell_back_even_with_no_backend_on_it(
    proc: FakeProc,
) -> None:
    board = FakeGpu(used=3 * GIB, compute=[ProcessInfo(100, 2 * GIB)])
    meter = NvmlMeter(open_nvml(FakeNvml([board])), proc=proc.root)
    assert not gpu0([d.reading() for d in meter.sample({"known": 100})]).by_delta
    board.process_error = NVML_ERROR_NO_PERMISSION
    assert gpu0([d.reading() for d in meter.sample({"known": 100})]).by_delta
    assert gpu0([d.reading() for d in meter.sample({})]).by_delta


def harness() -> Harness:
    """gpu0 and host metered per process at start; known (2 GiB) and new share gpu0."""
    return Harness(
        [BackendSpec(name="known", gpus=("gpu0",)), BackendSpec(name="new", gpus=("gpu0",))],
        devices=(replace(gpu(), per_process=True), replace(host(), per_process=True)),
        profiles={"known": (2, 1, 1)},
    )


def metering(h: Harness, sent: list[Event]) -> Metering:
    return Metering(
        policy=h.s,
        meter=None,
        profiles=None,
        records={},
        send_event=sent.append,
        spawn=lambda *args: None,
        meter_interval_s=1.0,
        profile_interval_s=0.25,
    )


def test_the_fallback_is_logged_once_and_first_loads_there_then_go_alone(
    proc: FakeProc, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness()
    h.load("known", "r1")
    h.finish("r1", at=1)
    board = FakeGpu(used=3 * GIB, compute=[ProcessInfo(100, 2 * GIB)])
    meter = NvmlMeter(open_nvml(FakeNvml([board])), proc=proc.root)
    sent: list[Event] = []
    engine_side = metering(h, sent)
    with caplog.at_level(logging.WARNING, logger="yard.engine"):
        engine_side.take_readings([d.reading() for d in meter.sample({"known": 100})])
        board.process_error = NVML_ERROR_NO_PERMISSION
        for _ in range(2):
            engine_side.take_readings([d.reading() for d in meter.sample({"known": 100})])
    fell_back = [e for e in sent if isinstance(e, MemoryMeasured) and e.by_delta]
    assert [e.device for e in fell_back] == ["gpu0", "gpu0"]
    assert engine_side.by_delta == frozenset({"gpu0"})
    said = [r.getMessage() for r in caplog.records if "fell back to device deltas" in r.message]
    assert said == [
        "gpu0: the meter fell back to device deltas (it cannot tell the backends apart there); "
        "first loads there are measured alone from now on"
    ]
    flags = [d for e in sent for d in h.feed(e, at=2) if isinstance(d, Flag)]
    assert [f.reason.split(":")[0] for f in flags] == ["gpu0"]  # flagged once
    [device] = [d for d in h.s.snapshot(2).devices if d.name == "gpu0"]
    assert device.per_process is False
    # The first load of new now stops idle known, to be measured alone.
    [stop] = h.arrive("r2", "new", at=3)
    assert isinstance(stop, StopBackend) and stop.backend == "known"
    [start] = h.stopped("known", at=4)
    assert isinstance(start, StartBackend) and start.backend == "new" and start.measure
