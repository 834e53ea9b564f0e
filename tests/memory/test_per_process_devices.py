"""Which devices each meter tells backends apart on (a first load there goes
next to the others; elsewhere it is measured alone, by the device's growth)."""

from __future__ import annotations

from pathlib import Path

from tests.memory.fake_proc import FakeProc
from tests.memory.test_apple_meter import FakeMac
from tests.memory.test_drm_meter import amd_machine, drm_meter
from yard.memory import default_meter
from yard.memory.apple import AppleMeter
from yard.testing.gpu import (
    GIB,
    NVML_ERROR_NOT_SUPPORTED,
    FakeGpu,
    FakeNvml,
    ProcessInfo,
)


def test_nvml_gpus_with_readable_process_lists_are_per_process(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(200)
    boards = [
        FakeGpu(used=GIB, compute=[ProcessInfo(200, GIB)]),
        FakeGpu(process_error=NVML_ERROR_NOT_SUPPORTED),
        FakeGpu(used=GIB, compute=[ProcessInfo(4_000_000, GIB // 2)]),  # not in this /proc
    ]
    m = default_meter(nvml=FakeNvml(boards), proc=proc.root, sys_root=tmp_path / "sys")
    assert m.per_process_devices() == {"host", "gpu0"}


def test_drm_cards_and_apple_unified_memory_are_per_process(tmp_path: Path) -> None:
    assert drm_meter(amd_machine(tmp_path)).per_process_devices() == {"gpu0"}
    assert AppleMeter(FakeMac()).per_process_devices() == {"host", "gpu0"}
